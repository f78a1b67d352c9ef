module github.com/ratekit/ratekit

go 1.25.0
