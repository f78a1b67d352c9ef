module github.com/ratekit/ratekit/lambda

go 1.26.0

require (
	github.com/aws/aws-lambda-go v1.55.1
	github.com/ratekit/ratekit v0.1.0
)

replace github.com/ratekit/ratekit => ..
