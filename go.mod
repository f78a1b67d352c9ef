module github.com/ratekit/ratekit

go 1.26.0
