// Package dirty drops the lane twice.
package dirty

import (
	"context"
	"net/http"
)

func call(ctx context.Context) error { return nil }

func Handle(w http.ResponseWriter, r *http.Request) {
	_ = call(context.Background())
	req, _ := http.NewRequest("GET", "http://orders/", nil)
	_ = req
}
