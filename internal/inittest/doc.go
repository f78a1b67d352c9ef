// Package inittest checks that importing ratekit's library packages does no
// work at package initialisation. It has tests only.
package inittest
