package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
)

// TestPprof: the profiles go tool pprof reads, the text forms, and the
// refusals, each naming what would do.
func TestPprof(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET /debug/pprof/", pprofHandler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	// go tool pprof reads the heap and CPU profiles.
	for _, path := range []string{"/debug/pprof/heap?gc=1", "/debug/pprof/goroutine", "/debug/pprof/profile?seconds=1"} {
		code, body := get(path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		f := filepath.Join(t.TempDir(), "profile")
		os.WriteFile(f, []byte(body), 0o600)
		if out, err := exec.Command("go", "tool", "pprof", "-top", f).CombinedOutput(); err != nil || !strings.Contains(string(out), "flat") {
			t.Errorf("go tool pprof -top %s: %v\n%s", path, err, out)
		}
	}
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/debug/pprof/", 200, "  heap "},
		{"/debug/pprof/", 200, "  profile       CPU, ?seconds=N (default 30, up to 300)"},
		{"/debug/pprof/heap?debug=1", 200, "heap profile: "},
		{"/debug/pprof/goroutine?debug=2", 200, "goroutine "},
		{"/debug/pprof/nope", 404, `no profile "nope"; /debug/pprof/ lists them`},
		{"/debug/pprof/heap?debug=3", 400, "debug: 0 (for go tool pprof), 1 or 2 (text)"},
		{"/debug/pprof/profile?seconds=0", 400, "seconds: 1 to 300"},
		{"/debug/pprof/profile?seconds=301", 400, "seconds: 1 to 300"},
	} {
		if code, body := get(c.path); code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %q; want %d and %q", c.path, code, body, c.code, c.want)
		}
	}
	// One CPU profile at a time.
	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		t.Fatal(err)
	}
	code, body := get("/debug/pprof/profile?seconds=1")
	pprof.StopCPUProfile()
	if code != http.StatusConflict || !strings.Contains(body, "(one at a time)") {
		t.Errorf("second CPU profile: %d %q", code, body)
	}
}
