module github.com/ratekit/ratekit/breaker

go 1.25.0

require (
	github.com/ratekit/ratekit v0.1.0
	github.com/sony/gobreaker/v2 v2.4.0
)

replace github.com/ratekit/ratekit => ..
