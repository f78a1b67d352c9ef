package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit/examples/internal/plans"
)

// The customers table's attributes. Its partition key is customerKeyAttr, a
// string: the API key's httplimit.APIKey ("key:" and 32 hex digits), never
// the key itself.
const (
	customerKeyAttr = "api_key"
	planAttr        = "plan"
	quotaAttr       = "quota"          // a number, enterprise customers only
	anchorAttr      = "billing_anchor" // RFC 3339, absent for calendar months
)

// defaultCustomerTTL is how long an instance serves a customer (or the
// absence of one) from memory before it reads the table again: a plan
// change made by another instance reaches this one within it.
const defaultCustomerTTL = 10 * time.Second

// maxCachedCustomers bounds the memory a customer cache holds; when full it
// starts afresh (invented keys are cached as unknown too).
const maxCachedCustomers = 100_000

// dynamoCustomers is the customer table in DynamoDB, a table of its own
// (see README.md), served from memory: a customer is read with one
// eventually consistent GetItem at most once per ttl in an instance, so a
// decision waits on the table only on the first call of a key in a ttl.
// Its methods are safe for concurrent use.
type dynamoCustomers struct {
	client *dynamodb.Client
	table  string
	ttl    time.Duration
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]cachedCustomer
}

// cachedCustomer is a customer read at some time, or its absence.
type cachedCustomer struct {
	cu      plans.Customer
	known   bool
	expires time.Time
}

// newDynamoCustomers returns the customers of table, served from memory
// for ttl (zero means defaultCustomerTTL).
func newDynamoCustomers(client *dynamodb.Client, table string, ttl time.Duration) *dynamoCustomers {
	if ttl == 0 {
		ttl = defaultCustomerTTL
	}
	return &dynamoCustomers{client: client, table: table, ttl: ttl, now: time.Now, cache: map[string]cachedCustomer{}}
}

// Customer implements plans.Customers: from memory when read less than ttl
// ago, else with one GetItem.
func (c *dynamoCustomers) Customer(ctx context.Context, key string) (plans.Customer, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.cache[key]
	c.mu.Unlock()
	if !ok || !now.Before(e.expires) {
		out, err := c.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(c.table),
			Key:       map[string]types.AttributeValue{customerKeyAttr: &types.AttributeValueMemberS{Value: key}},
		})
		if err != nil {
			return plans.Customer{}, fmt.Errorf("reading the customers table: %w", err)
		}
		e = cachedCustomer{known: out.Item != nil, expires: now.Add(c.ttl)}
		if e.known {
			if e.cu, err = parseCustomer(out.Item); err != nil {
				return plans.Customer{}, err
			}
		}
		c.remember(key, e)
	}
	if !e.known {
		return plans.Customer{}, plans.ErrUnknownCustomer
	}
	return e.cu, nil
}

// remember caches e under key.
func (c *dynamoCustomers) remember(key string, e cachedCustomer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cache) >= maxCachedCustomers {
		clear(c.cache)
	}
	c.cache[key] = e
}

// SetPlan implements plans.Customers with one conditional UpdateItem; this
// instance serves the new plan at once, the others within their ttl.
func (c *dynamoCustomers) SetPlan(ctx context.Context, key, plan string, quota int64) (plans.Customer, error) {
	if err := plans.ValidPlan(plan, quota); err != nil {
		return plans.Customer{}, err
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                aws.String(c.table),
		Key:                      map[string]types.AttributeValue{customerKeyAttr: &types.AttributeValueMemberS{Value: key}},
		ConditionExpression:      aws.String("attribute_exists(#k)"),
		UpdateExpression:         aws.String("SET #p = :p REMOVE #q"),
		ExpressionAttributeNames: map[string]string{"#k": customerKeyAttr, "#p": planAttr, "#q": quotaAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":p": &types.AttributeValueMemberS{Value: plan},
		},
		ReturnValues: types.ReturnValueAllNew,
	}
	if plan == plans.Enterprise {
		in.UpdateExpression = aws.String("SET #p = :p, #q = :q")
		in.ExpressionAttributeValues[":q"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(quota, 10)}
	}
	out, err := c.client.UpdateItem(ctx, in)
	var failed *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &failed):
		return plans.Customer{}, plans.ErrUnknownCustomer
	case err != nil:
		return plans.Customer{}, fmt.Errorf("updating the customers table: %w", err)
	}
	cu, err := parseCustomer(out.Attributes)
	if err != nil {
		return plans.Customer{}, err
	}
	c.remember(key, cachedCustomer{cu: cu, known: true, expires: c.now().Add(c.ttl)})
	return cu, nil
}

// add writes cu under key unless the table has a customer of that key
// already (whose plan may have changed since), and reports whether it
// wrote.
func (c *dynamoCustomers) add(ctx context.Context, key string, cu plans.Customer) (bool, error) {
	item := map[string]types.AttributeValue{
		customerKeyAttr: &types.AttributeValueMemberS{Value: key},
		planAttr:        &types.AttributeValueMemberS{Value: cu.Plan},
	}
	if cu.Plan == plans.Enterprise {
		item[quotaAttr] = &types.AttributeValueMemberN{Value: strconv.FormatInt(cu.Quota, 10)}
	}
	if !cu.BillingAnchor.IsZero() {
		item[anchorAttr] = &types.AttributeValueMemberS{Value: cu.BillingAnchor.Format(time.RFC3339Nano)}
	}
	_, err := c.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                aws.String(c.table),
		Item:                     item,
		ConditionExpression:      aws.String("attribute_not_exists(#k)"),
		ExpressionAttributeNames: map[string]string{"#k": customerKeyAttr},
	})
	var exists *types.ConditionalCheckFailedException
	if errors.As(err, &exists) {
		return false, nil
	}
	return err == nil, err
}

// errMalformedCustomer is matched by the error for an item of the customers
// table that is not a customer this API can serve; the call gets 503 and the
// log names the attribute.
var errMalformedCustomer = errors.New("malformed item in the customers table")

// parseCustomer reads an item of the customers table.
func parseCustomer(item map[string]types.AttributeValue) (plans.Customer, error) {
	var cu plans.Customer
	p, ok := item[planAttr].(*types.AttributeValueMemberS)
	if !ok {
		return cu, fmt.Errorf("%w: no string attribute %q", errMalformedCustomer, planAttr)
	}
	cu.Plan = p.Value
	if q, ok := item[quotaAttr].(*types.AttributeValueMemberN); ok {
		n, err := strconv.ParseInt(q.Value, 10, 64)
		if err != nil {
			return cu, fmt.Errorf("%w: %q is not a whole number", errMalformedCustomer, quotaAttr)
		}
		cu.Quota = n
	}
	if a, ok := item[anchorAttr].(*types.AttributeValueMemberS); ok {
		t, err := time.Parse(time.RFC3339Nano, a.Value)
		if err != nil {
			return cu, fmt.Errorf("%w: %q: %w", errMalformedCustomer, anchorAttr, err)
		}
		cu.BillingAnchor = t
	}
	if err := plans.ValidPlan(cu.Plan, cu.Quota); err != nil {
		return cu, fmt.Errorf("%w: %w", errMalformedCustomer, err)
	}
	return cu, nil
}

// createCustomersTable creates the customers table (on-demand billing,
// partition key customerKeyAttr) unless it exists, and waits until it is
// active, within ctx's deadline.
func createCustomersTable(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(customerKeyAttr), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(customerKeyAttr), KeyType: types.KeyTypeHash}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return err
	}
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 100 * time.Millisecond
		o.MaxDelay = 2 * time.Second
	})
	return waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, 2*time.Minute)
}
