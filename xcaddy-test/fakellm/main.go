// Command fakellm is a fake model server for end-to-end tests of the
// fair_queue gateway, speaking OpenAI's chat and completions APIs and
// Anthropic's Messages API (anthropic.go). It behaves like a small vLLM
// server: a fixed number of generation slots with a FIFO queue behind
// them, a time to first token and a time per token, SSE streaming with
// OpenAI's usage semantics and Anthropic's event stream, a switchable
// /health, Prometheus metrics, and a record of every
// request it received (/debug/requests) so a test can prove what reached the
// upstream, in which order, and with which body.
//
// On start it prints one line "FAKELLM_LISTENING <host:port>" to stdout, so
// a harness can pass -listen 127.0.0.1:0 and learn the port without a race.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	cfg := DefaultConfig()
	listen := flag.String("listen", "127.0.0.1:8001", "address to listen on (port 0 picks a free port)")
	flag.StringVar(&cfg.Name, "name", cfg.Name, "name echoed in the X-Fake-Upstream response header")
	flag.IntVar(&cfg.Slots, "slots", cfg.Slots, "concurrent generation slots; more requests wait in a FIFO queue")
	flag.DurationVar(&cfg.TTFT, "ttft", cfg.TTFT, "time to first token, after a slot is acquired")
	flag.DurationVar(&cfg.PerToken, "per-token", cfg.PerToken, "time per output token")
	flag.IntVar(&cfg.DefaultOutput, "default-output", cfg.DefaultOutput, "output tokens without ignore_eos: min(max_tokens, default-output)")
	flag.BoolVar(&cfg.Down, "down", false, "start with /health answering 503")
	flag.Float64Var(&cfg.TPM, "tpm", 0, "the account's tokens per minute (prompt + max_tokens); beyond it, 429. 0: no limit")
	flag.Float64Var(&cfg.RPM, "rpm", 0, "the account's requests per minute; beyond it, 429. 0: no limit")
	flag.StringVar(&cfg.Window, "limit-window", WindowBucket, "how the account counts its minute: bucket (refilled continuously), rolling (the last 60 s) or fixed (the clock's minutes)")
	flag.Parse()
	if err := validWindow(cfg.Window); err != nil {
		fmt.Fprintln(os.Stderr, "fakellm:", err)
		os.Exit(2)
	}

	cfg.Logger = log.New(os.Stderr, "fakellm["+cfg.Name+"] ", log.LstdFlags|log.Lmicroseconds)
	if err := run(*listen, cfg); err != nil {
		cfg.Logger.Print(err)
		os.Exit(1)
	}
}

func run(listen string, cfg Config) error {
	logger := cfg.Logger
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fake := New(cfg)
	srv := &http.Server{Handler: fake, ErrorLog: logger, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("FAKELLM_LISTENING %s\n", ln.Addr())
	logger.Printf("listening on %s (slots=%d ttft=%s per-token=%s default-output=%d healthy=%t)",
		ln.Addr(), cfg.Slots, cfg.TTFT, cfg.PerToken, cfg.DefaultOutput, !cfg.Down)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Print("shutting down")
	// Abort generations first: a paused or long request must not hold the
	// process past a test's cleanup.
	fake.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
