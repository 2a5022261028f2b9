package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// redisLogEvery is how often one kind of go-redis's own log line (a failed
// dial, say) is written at most; the ones between are counted.
const redisLogEvery = 10 * time.Second

// redisLog routes go-redis's own log lines through Caddy's logger: at most
// one line of each kind (its format) per interval, with the count held
// back since. go-redis has one logger per process.
type redisLog struct {
	every time.Duration
	now   func() time.Time
	log   func() *zap.Logger

	mu   sync.Mutex
	kind map[string]*redisLogKind // by format: go-redis has a few dozen
}

type redisLogKind struct {
	last time.Time
	held int
}

// Printf implements go-redis's logging interface.
func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	held, due := l.due(format)
	if !due {
		return
	}
	l.log().Warn(fmt.Sprintf(format, v...), zap.Int("like_it_held_back", held), zap.Duration("at_most_one_per", l.every))
}

// due counts a line of the kind format and reports whether it is to be
// written, with how many of its kind were held back since the last one.
func (l *redisLog) due(format string) (held int, due bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.kind[format]
	if k == nil {
		k = &redisLogKind{}
		l.kind[format] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < l.every {
		k.held++
		return 0, false
	}
	held = k.held
	k.last, k.held = now, 0
	return held, true
}

var redisLogOnce sync.Once

// routeRedisLog installs the redisLog once per process.
func routeRedisLog() {
	redisLogOnce.Do(func() {
		redis.SetLogger(&redisLog{every: redisLogEvery, now: time.Now, kind: map[string]*redisLogKind{},
			log: func() *zap.Logger { return caddy.Log().Named("http.handlers.fair_queue.redis") }})
	})
}
