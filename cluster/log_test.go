package cluster

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// go-redis's own lines go through zap, at most one of a kind per
// interval, with the count of those held back; kinds apart.
func TestRedisLogRateLimited(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	now := time.Unix(1000, 0)
	l := &redisLog{every: 10 * time.Second, now: func() time.Time { return now }, kind: map[string]*redisLogKind{},
		log: func() *zap.Logger { return zap.New(core) }}
	dial := "redis: connection pool: failed to dial after %d attempts: %v"
	for i := range 30 {
		l.Printf(context.Background(), dial, 1, "connection refused")
		now = now.Add(600 * time.Millisecond) // 30 in 18 s
		if i == 5 {
			l.Printf(context.Background(), "redis: discarding bad PubSub connection: %v", "EOF")
		}
	}
	got := logs.All()
	if len(got) != 3 {
		t.Fatalf("%d lines for 30 failed dials in 18 s and one other, want 3 (dials at 0 and 10.2 s, the other)", len(got))
	}
	if got[0].Message != "redis: connection pool: failed to dial after 1 attempts: connection refused" || got[0].Level != zapcore.WarnLevel {
		t.Errorf("first line %q at %v", got[0].Message, got[0].Level)
	}
	if held := got[2].ContextMap()["like_it_held_back"]; held != int64(16) {
		t.Errorf("the second dial line says %v held back, want 16 (those between 0.6 s and 9.6 s)", held)
	}
}
