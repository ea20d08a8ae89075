package bearer

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// An envelope carries a token in the form of a JSON Web Token: the form in which gRPC's own xDS
// bootstrap sends a credential by itself (its call credentials "jwt_token_file" read a file, take
// the expiry from the JWT's exp claim, and send the file's text as a bearer token over TLS). An
// envelope is not signed (alg "none") and proves nothing by itself: the token inside it does, and
// the receiver checks that token as it checks any. It is written here rather than with a JWT
// library because there is nothing to sign or verify: two base64url JSON objects and a dot.

// envelopeClaim is the claim that holds the token.
const envelopeClaim = "lanes_token"

// MaxEnvelopeBytes bounds an envelope a receiver reads.
const MaxEnvelopeBytes = 4096

var envelopeHeader = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))

// Envelope returns token in an envelope that expires at exp.
func Envelope(token string, exp time.Time) string {
	claims, _ := json.Marshal(map[string]any{"exp": exp.Unix(), envelopeClaim: token})
	return envelopeHeader + "." + base64.RawURLEncoding.EncodeToString(claims) + "."
}

// ErrEnvelope is wrapped by the errors of an envelope that is malformed or expired.
var ErrEnvelope = errors.New("token envelope")

// Unwrap returns the token inside s when s is an envelope (Envelope's form: a JWT with alg
// "none" and the token's claim); isEnvelope is false, and s is left alone, when s is not one.
// An envelope that has expired at now, or is malformed, is an error wrapping ErrEnvelope.
func Unwrap(s string, now time.Time) (token string, isEnvelope bool, err error) {
	head, rest, ok := strings.Cut(s, ".")
	if !ok || head != envelopeHeader {
		return "", false, nil
	}
	if len(s) > MaxEnvelopeBytes {
		return "", true, fmt.Errorf("%w: %d bytes, at most %d", ErrEnvelope, len(s), MaxEnvelopeBytes)
	}
	body, sig, ok := strings.Cut(rest, ".")
	if !ok || sig != "" {
		return "", true, fmt.Errorf("%w: want header.claims. with no signature", ErrEnvelope)
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return "", true, fmt.Errorf("%w: claims: %v", ErrEnvelope, err)
	}
	var claims struct {
		Exp   *int64 `json:"exp"`
		Token string `json:"lanes_token"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		return "", true, fmt.Errorf("%w: claims: %v", ErrEnvelope, err)
	}
	switch {
	case claims.Token == "":
		return "", true, fmt.Errorf("%w: no %s claim", ErrEnvelope, envelopeClaim)
	case claims.Exp == nil:
		return "", true, fmt.Errorf("%w: no exp claim", ErrEnvelope)
	case !now.Before(time.Unix(*claims.Exp, 0)):
		return "", true, fmt.Errorf("%w: expired at %s", ErrEnvelope, time.Unix(*claims.Exp, 0).UTC().Format(time.RFC3339))
	}
	return claims.Token, true, nil
}
