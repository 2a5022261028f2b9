package manualclock

import (
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	start := Epoch
	c := New(start)
	c.Advance(time.Second)
	c.Set(start.Add(3 * time.Second))
	c.Set(c.Now())
	if got := c.Now().Sub(start); got != 3*time.Second {
		t.Fatalf("Now is start + %v, want 3s", got)
	}
	for name, back := range map[string]func(){
		"Set":     func() { c.Set(start) },
		"Advance": func() { c.Advance(-1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s backwards: no panic", name)
				}
			}()
			back()
		}()
	}
}
