package configs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// GatewayIDFile, in gateway.data_dir, holds the gateway id the data
// directory is used with: the one made at the first start when gateway.id
// is not set, or the one set.
const GatewayIDFile = "gateway-id"

// hostname is os.Hostname, replaced in tests.
var hostname = os.Hostname

// GatewayID says where the id ResolveGatewayID settled on came from.
type GatewayID struct {
	ID   string
	From string // "gateway.id", "stored", "host name" or "generated"
	File string // the GatewayIDFile
	// Was is the id the data directory was used with before, when
	// gateway.id now sets another.
	Was string
}

// ResolveGatewayID settles the gateway id and sets c.Gateway.ID. Call it
// once the data directory is locked (gateway.LockDataDir), before anything
// uses the id.
//
// gateway.id, when set, is used as it is. When it is not, the id is the
// one in <data_dir>/gateway-id; at the first start, with no such file,
// the gateway makes one: the host name, a dash and 10 random hex digits
// (raspberrypi-3fa9c2d41b). Clones of one SD card image, which share a
// host name and often /etc/machine-id, so get ids of their own, and a
// gateway keeps its id across restarts and renames. A data directory
// that already holds a queue, journal or state from a version that used
// the bare host name keeps the host name (its Kafka transactional id and
// delivered position depend on it). The id in use is written to the file
// (atomically and durably), so that unsetting gateway.id later keeps it.
func (c *Config) ResolveGatewayID() (GatewayID, error) {
	g, stored, err := c.peekGatewayID()
	if err != nil {
		return g, err
	}
	if g.ID != stored {
		if err := writeFileDurably(c.Gateway.DataDir, GatewayIDFile, []byte(g.ID+"\n")); err != nil {
			return g, fmt.Errorf("gateway.id: keep it in %s: %w", g.File, err)
		}
	}
	c.Gateway.ID = g.ID
	return g, nil
}

// PeekGatewayID is the id ResolveGatewayID would settle on, without
// writing anything or changing c (for `edgegate check`). Before the first
// start it is one the gateway could make: the same form, another random
// part (From is "generated").
func (c *Config) PeekGatewayID() (GatewayID, error) {
	g, _, err := c.peekGatewayID()
	return g, err
}

// peekGatewayID works the id out, and returns the one stored, if any.
func (c *Config) peekGatewayID() (GatewayID, string, error) {
	dir := c.Gateway.DataDir
	g := GatewayID{File: filepath.Join(dir, GatewayIDFile)}
	stored, err := readGatewayID(g.File)
	if err != nil {
		return g, "", err
	}
	switch {
	case c.Gateway.ID != "":
		g.ID, g.From = c.Gateway.ID, "gateway.id"
		if stored != c.Gateway.ID {
			g.Was = stored
		}
	case stored != "":
		g.ID, g.From = stored, "stored"
	case usedBefore(dir):
		host, _ := hostname()
		g.ID, g.From = sanitizeID(host), "host name"
	default:
		host, _ := hostname()
		prefix := sanitizeID(host)
		if len(prefix) > 64-11 {
			prefix = prefix[:64-11]
		}
		var r [5]byte
		if _, err := rand.Read(r[:]); err != nil {
			return g, "", fmt.Errorf("gateway.id: make one: %w", err)
		}
		g.ID, g.From = prefix+"-"+hex.EncodeToString(r[:]), "generated"
	}
	return g, stored, nil
}

// readGatewayID reads the file, "" if there is none.
func readGatewayID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("gateway.id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if !idRE.MatchString(id) {
		return "", fmt.Errorf("gateway.id: %s holds %q, not a gateway id; put back the id this gateway had, or set gateway.id (removing the file makes a new id, and the gateway then delivers under it)", path, id)
	}
	return id, nil
}

// usedBefore reports whether the data directory holds a queue, journal
// or state (from a version before GatewayIDFile).
func usedBefore(dir string) bool {
	for _, sub := range []string{"outbound", "ingest", "state"} {
		if entries, err := os.ReadDir(filepath.Join(dir, sub)); err == nil && len(entries) > 0 {
			return true
		}
	}
	return false
}

// writeFileDurably replaces dir/name with data: write a temporary file,
// fsync it, rename it over the old one, fsync the directory.
func writeFileDurably(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
