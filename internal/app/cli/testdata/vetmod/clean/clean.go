// Package clean keeps the lane.
package clean

import (
	"context"
	"net/http"
)

func call(ctx context.Context) error { return nil }

func Handle(w http.ResponseWriter, r *http.Request) {
	_ = call(r.Context())
	_ = call(context.Background()) //lanes:ignore the audit write outlives the request on purpose
}
