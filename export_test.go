package ratekit

// SumParts exposes sumParts to the external tests.
var SumParts = sumParts
