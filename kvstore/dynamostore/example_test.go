package dynamostore_test

import (
	"context"
	"fmt"
	"log"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A token bucket on DynamoDB, exact across Lambda instances (Atomic mode:
// one conditional write per decision). In a Lambda function, build the
// client from aws-sdk-go-v2/config's LoadDefaultConfig in the init phase;
// here it points at a local DynamoDB (dynalite) instead.
func Example() {
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://127.0.0.1:8000"),
		Credentials:  aws.AnonymousCredentials{},
	})
	store, err := dynamostore.New(client, dynamostore.Config{Table: "ratekit", Prefix: "myapp:"})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := tokenbucket.New(tokenbucket.Config{
		Name:       "api",
		Burst:      20,
		RefillRate: tokenbucket.PerSecond(5),
		Mode:       tokenbucket.Atomic,
		Store:      store,
	})
	if err != nil {
		log.Fatal(err)
	}
	d, err := limiter.Allow(context.Background(), ratekit.Request{Key: "user-42"})
	if err != nil {
		log.Fatal(err) // or fail open or closed: see httplimit.Guard
	}
	fmt.Println(d.Allowed, d.Remaining)
}
