package lograte

import (
	"context"
	"log/slog"
	"time"
)

// Handler rate-limits a library's log (the broker's): mochi logs every malformed
// packet at warn level with the whole packet, so a client sending garbage
// in a loop would otherwise fill the card with log. Each message is logged
// at most once per 10 s, with the number suppressed since; info messages
// (start and stop) pass.
type Handler struct {
	slog.Handler
	lim *Limiter
}

// NewHandler wraps h.
func NewHandler(h slog.Handler) *Handler {
	return &Handler{Handler: h, lim: &Limiter{Every: 10 * time.Second}}
}

func (q *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level != slog.LevelInfo {
		ok, held := q.lim.Allow(r.Message, r.Time)
		if !ok {
			return nil
		}
		if held > 0 {
			r.AddAttrs(slog.Int("suppressed_since_last", held))
		}
	}
	return q.Handler.Handle(ctx, r)
}

func (q *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{Handler: q.Handler.WithAttrs(as), lim: q.lim}
}

func (q *Handler) WithGroup(name string) slog.Handler {
	return &Handler{Handler: q.Handler.WithGroup(name), lim: q.lim}
}
