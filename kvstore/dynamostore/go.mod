module github.com/ratekit/ratekit/kvstore/dynamostore

go 1.26.0

require (
	github.com/aws/aws-lambda-go v1.55.1
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/service/dynamodb v1.73.2
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/ratekit/ratekit/internal/pgengine v0.0.0-00010101000000-000000000000 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

require (
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.11 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.11 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.13.24 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/endpoint-discovery v1.13.11 // indirect
	github.com/aws/smithy-go v1.28.9
	github.com/ratekit/ratekit v0.0.0-00010101000000-000000000000
)

replace github.com/ratekit/ratekit => ../..

require (
	github.com/ratekit/ratekit/durable v0.0.0-00010101000000-000000000000
	github.com/ratekit/ratekit/internal/pgtest v0.0.0-00010101000000-000000000000
	github.com/ratekit/ratekit/kvstore/redisstore v0.0.0-00010101000000-000000000000
	github.com/ratekit/ratekit/lambda v0.0.0-00010101000000-000000000000
	github.com/ratekit/ratekit/pgstore v0.0.0-00010101000000-000000000000
)

replace (
	github.com/ratekit/ratekit/durable => ../../durable
	github.com/ratekit/ratekit/internal/pgengine => ../../internal/pgengine
	github.com/ratekit/ratekit/internal/pgtest => ../../internal/pgtest
	github.com/ratekit/ratekit/internal/redistest => ../../internal/redistest
	github.com/ratekit/ratekit/kvstore/redisstore => ../redisstore
	github.com/ratekit/ratekit/lambda => ../../lambda
	github.com/ratekit/ratekit/pgstore => ../../pgstore
)
