// Package bearer reads the credential of a request, written once for every receiver of the
// control plane that takes a token (the admin API, the trace collector's receivers): the token
// of an Authorization header value that uses the Bearer scheme.
package bearer

import "strings"

// Token returns the token of an Authorization header value that uses the Bearer scheme, whose
// name is case-insensitive (RFC 9110, 11.1); false when h is not one, or its token is empty.
func Token(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
