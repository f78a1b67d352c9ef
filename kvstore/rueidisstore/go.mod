module github.com/ratekit/ratekit/kvstore/rueidisstore

go 1.25.0

require github.com/redis/rueidis v1.0.79

require github.com/ratekit/ratekit v0.1.0

require golang.org/x/sys v0.47.0 // indirect

replace github.com/ratekit/ratekit => ../..
