//go:build !unix

package lanesnats_test

const childEnv = "LANESNATS_CHURN_CHILD"

func childMain() int { return 2 }
