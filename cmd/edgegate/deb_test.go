//go:build e2e

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDebianPackage builds the .deb packages with make deb (nfpm) and
// checks them with dpkg-deb: control fields, contents and modes, the
// config as a conffile, maintainer scripts; the amd64 package's binary
// runs; and systemd-analyze verify accepts the unit.
func TestDebianPackage(t *testing.T) {
	need(t, "dpkg-deb", "make")
	out, err := exec.Command("make", "-C", "../..", "deb", "DEB_VERSION=1.2.3~e2e").CombinedOutput()
	if err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	for _, arch := range []string{"armhf", "arm64", "amd64"} {
		deb := filepath.Join("../../dist", "edgegate_1.2.3~e2e_"+arch+".deb")
		field := func(name string) string {
			b, err := exec.Command("dpkg-deb", "-f", deb, name).Output()
			if err != nil {
				t.Fatalf("dpkg-deb -f %s %s: %v", deb, name, err)
			}
			return strings.TrimSpace(string(b))
		}
		if field("Package") != "edgegate" || field("Version") != "1.2.3~e2e" || field("Architecture") != arch || field("Pre-Depends") != "adduser" {
			t.Errorf("%s: control fields wrong", deb)
		}
		list, err := exec.Command("dpkg-deb", "-c", deb).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"-rwxr-xr-x root/root", "./usr/bin/edgegate", "-rw-r----- root/root", "./etc/edgegate/edgegate.yaml",
			"./lib/systemd/system/edgegate.service", "drwxr-x--- root/root", "./var/lib/edgegate/"} {
			if !strings.Contains(string(list), want) {
				t.Errorf("%s: contents lack %q:\n%s", deb, want, list)
			}
		}
		dir := t.TempDir()
		if out, err := exec.Command("dpkg-deb", "-e", deb, dir).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb -e: %v %s", err, out)
		}
		conf, _ := os.ReadFile(filepath.Join(dir, "conffiles"))
		if strings.TrimSpace(string(conf)) != "/etc/edgegate/edgegate.yaml" {
			t.Errorf("%s: conffiles %q", deb, conf)
		}
		for _, s := range []string{"postinst", "prerm", "postrm"} {
			if fi, err := os.Stat(filepath.Join(dir, s)); err != nil || fi.Mode()&0o111 == 0 {
				t.Errorf("%s: %s missing or not executable", deb, s)
			}
		}
		if arch != "amd64" || runtime.GOARCH != "amd64" {
			continue
		}
		root := t.TempDir()
		if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb -x: %v %s", err, out)
		}
		bin := filepath.Join(root, "usr/bin/edgegate")
		if out, err := exec.Command(bin, "version").Output(); err != nil || !strings.HasPrefix(string(out), "edgegate ") {
			t.Errorf("packaged binary: %v %q", err, out)
		}
		if _, err := exec.LookPath("systemd-analyze"); err != nil {
			t.Log("systemd-analyze not found: unit not verified")
			continue
		}
		unit, _ := os.ReadFile(filepath.Join(root, "lib/systemd/system/edgegate.service"))
		copyPath := filepath.Join(t.TempDir(), "edgegate.service")
		os.WriteFile(copyPath, []byte(strings.ReplaceAll(string(unit), "/usr/bin/edgegate", bin)), 0o644)
		if out, err := exec.Command("systemd-analyze", "verify", copyPath).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}
}
