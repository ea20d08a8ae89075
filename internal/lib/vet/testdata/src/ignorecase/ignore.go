package ignorecase

import "context"

func call(ctx context.Context) error { return nil }

func handler(ctx context.Context) {
	_ = call(context.Background()) //lanes:ignore the audit log must outlive the request's cancellation

	//lanes:ignore shutdown work runs after the request is done
	_ = call(context.Background())

	//lanes:ignore
	_ = call(context.Background()) // want `context.Background\(\) drops the lane of the request's context ctx.*\(//lanes:ignore needs a reason\)`

	_ = call(context.TODO()) //lanes:ignored is not the directive // want `context.TODO\(\) drops the lane`

	x := 1                         //lanes:ignore a comment after code on the line above silences only its own line
	_ = call(context.Background()) // want `context.Background\(\) drops`
	_ = x
}
