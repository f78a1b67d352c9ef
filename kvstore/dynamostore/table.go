package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// CreateTable creates the table a [Store] needs, for tests and local use:
// on-demand billing (PAY_PER_REQUEST), partition key KeyAttribute of type
// Binary and no sort key; it waits until the table is active, then enables
// Time to Live on TTLAttribute. A table of that name that exists already is
// not an error (its definition is not checked). It is the same as
//
//	aws dynamodb create-table --table-name NAME --billing-mode PAY_PER_REQUEST \
//	    --attribute-definitions AttributeName=pk,AttributeType=B \
//	    --key-schema AttributeName=pk,KeyType=HASH
//	aws dynamodb wait table-exists --table-name NAME
//	aws dynamodb update-time-to-live --table-name NAME \
//	    --time-to-live-specification Enabled=true,AttributeName=ttl
//
// Production tables belong in infrastructure code (CloudFormation, SAM,
// Terraform); docs/dynamodb.md in the repository has a template.
//
// It returns an error matching ErrNoTTL when the table is ready but the
// server does not implement UpdateTimeToLive, and the SDK's error (wrapped)
// when a request fails, or when the table is not active within ctx's
// deadline (at most two minutes).
func CreateTable(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(KeyAttribute), AttributeType: types.ScalarAttributeTypeB},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(KeyAttribute), KeyType: types.KeyTypeHash},
		},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return wrap(ctx, "CreateTable", err)
	}
	wait := 2 * time.Minute
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	if wait <= 0 {
		return wrap(ctx, "DescribeTable", context.DeadlineExceeded)
	}
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 100 * time.Millisecond
		o.MaxDelay = 2 * time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, wait); err != nil {
		return wrap(ctx, "DescribeTable", err)
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(TTLAttribute),
			Enabled:       aws.Bool(true),
		},
	})
	var api smithy.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException":
		return fmt.Errorf("%w: %w", ErrNoTTL, err)
	case errors.As(err, &api) && api.ErrorCode() == "ValidationException" && isTTLAlreadyEnabled(api.ErrorMessage()):
		return nil
	}
	return wrap(ctx, "UpdateTimeToLive", err)
}

// isTTLAlreadyEnabled reports whether a ValidationException of
// UpdateTimeToLive says that Time to Live is enabled already, which is what
// DynamoDB answers when CreateTable runs twice on one table.
func isTTLAlreadyEnabled(msg string) bool {
	return strings.Contains(msg, "TimeToLive is already enabled")
}
