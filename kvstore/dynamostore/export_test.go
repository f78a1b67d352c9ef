package dynamostore

import "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

// SetCapacityObserver makes s ask every request for its consumed capacity
// and pass it to f. Tests only: set before s is used.
func SetCapacityObserver(s *Store, f func(*types.ConsumedCapacity)) { s.capacity = f }
