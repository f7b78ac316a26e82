package main

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// maxCPUProfile bounds a CPU profile's length (?seconds=).
const maxCPUProfile = 5 * time.Minute

// pprofHandler serves the runtime's profiles under /debug/pprof/ (with
// http.pprof: true), in the format go tool pprof reads:
//
//	/debug/pprof/                      the list
//	/debug/pprof/NAME[?debug=N][&gc=1] a runtime/pprof profile: heap, allocs,
//	                                   goroutine, block, mutex, threadcreate;
//	                                   debug=1 or 2 as text, gc=1 collects first
//	/debug/pprof/profile[?seconds=N]   a CPU profile (default 30 s, up to 5 min)
//
// It is net/http/pprof less what a gateway's memory and CPU work does not
// need (execution traces, delta profiles, /symbol and /cmdline), which
// linked runtime/trace and a profile parser: 0.25 MiB of the ARM binary.
func pprofHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/debug/pprof/")
		q := r.URL.Query()
		switch name {
		case "":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "profiles (go tool pprof http://%s/debug/pprof/NAME):\n", r.Host)
			for _, p := range pprof.Profiles() {
				fmt.Fprintf(w, "  %-13s %d\n", p.Name(), p.Count())
			}
			fmt.Fprintf(w, "  %-13s CPU, ?seconds=N (default 30, up to %d)\n", "profile", int(maxCPUProfile.Seconds()))
			return
		case "profile":
			cpuProfile(w, r)
			return
		}
		p := pprof.Lookup(name)
		if p == nil {
			http.Error(w, fmt.Sprintf("no profile %q; /debug/pprof/ lists them", name), http.StatusNotFound)
			return
		}
		debug := 0
		if s := q.Get("debug"); s != "" {
			var err error
			if debug, err = strconv.Atoi(s); err != nil || debug < 0 || debug > 2 {
				http.Error(w, "debug: 0 (for go tool pprof), 1 or 2 (text)", http.StatusBadRequest)
				return
			}
		}
		if name == "heap" && q.Get("gc") == "1" {
			runtime.GC()
		}
		var buf bytes.Buffer
		if err := p.WriteTo(&buf, debug); err != nil {
			http.Error(w, "write profile: "+err.Error(), http.StatusInternalServerError)
			return
		}
		setProfileHeaders(w, name, debug)
		w.Write(buf.Bytes())
	})
}

// cpuProfile serves a CPU profile of ?seconds= (default 30), ending early
// if the client goes away.
func cpuProfile(w http.ResponseWriter, r *http.Request) {
	d := 30 * time.Second
	if s := r.URL.Query().Get("seconds"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || time.Duration(n)*time.Second > maxCPUProfile {
			http.Error(w, fmt.Sprintf("seconds: 1 to %d", int(maxCPUProfile.Seconds())), http.StatusBadRequest)
			return
		}
		d = time.Duration(n) * time.Second
	}
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		http.Error(w, "start CPU profile: "+err.Error()+" (one at a time)", http.StatusConflict)
		return
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-r.Context().Done():
		t.Stop()
	}
	pprof.StopCPUProfile()
	setProfileHeaders(w, "profile", 0)
	w.Write(buf.Bytes())
}

func setProfileHeaders(w http.ResponseWriter, name string, debug int) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if debug > 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name))
}
