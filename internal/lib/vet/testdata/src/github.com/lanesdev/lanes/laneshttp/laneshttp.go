// Package laneshttp is a stub of lanes' HTTP transport for the analyzers' tests.
package laneshttp

import "net/http"

type Transport struct{ Base http.RoundTripper }

func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) { return nil, nil }

func NewTransport() *Transport { return &Transport{} }
func NewClient() *http.Client  { return &http.Client{Transport: NewTransport()} }
