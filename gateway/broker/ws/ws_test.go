package ws

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestWSConnWriteDeadline: a write deadline set on the connection holds
// for the WebSocket's writes (gorilla would otherwise replace it with its
// own, none, at each write).
func TestWSConnWriteDeadline(t *testing.T) {
	got := make(chan *wsConn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		got <- &wsConn{Conn: c.NetConn(), c: c}
	}))
	defer srv.Close()
	client, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ws := <-got
	defer ws.Close()
	if err := ws.SetDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	var ne net.Error
	if _, err := ws.Write([]byte{0xd0, 0}); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("write past its deadline: %v, want a timeout", err)
	}
}
