package harness

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestDelayProxy: a round trip through the proxy takes at least twice its
// delay, the bytes arrive in order, and Close ends its connections.
func TestDelayProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c) // echo
	}()
	p := StartDelayProxy(t, ln.Addr().String(), 30*time.Millisecond)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	if rtt := time.Since(start); rtt < 60*time.Millisecond {
		t.Errorf("round trip %v through a proxy of 30ms each way, want at least 60ms", rtt)
	}
	p.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Error("the connection is still open after Close")
	}
}
