package controlplane

import (
	"testing"
)

// FuzzRoute checks that any route setting is either refused with a
// SettingError or accepted as a route that reads back the same from its
// String form; never a panic.
func FuzzRoute(f *testing.F) {
	for _, s := range []string{"/=web", "/api/v1=orders", "shop.example.com=web", "shop.example.com/api=orders",
		"web", "=web", "/=", "/=a/b", "host:80=web", ".x=web", "/a%zz=web", "/a%2Fb=web", "/a/../b=web",
		"/a//b=web", "a.com/?x=web", "=", "/=web=x", " / = web ", "[::1]=web", "/a b=web"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := Defaults()
		c.Routes = []string{s}
		gc, err := c.GatewayConfig()
		if err != nil {
			if _, ok := err.(*SettingError); !ok {
				t.Fatalf("%q: %T %v, want a *SettingError", s, err, err)
			}
			return
		}
		r := gc.Routes[0]
		back, err := ParseRoute(r.String())
		if err != nil || back != r {
			t.Fatalf("%q: accepted as %+v, which reads back as %+v (%v)", s, r, back, err)
		}
	})
}
