package main

import (
	"encoding/xml"
	"os"
	"strings"
	"testing"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue/simulator"
)

// -plot writes two well-formed SVG charts per run, each naming every
// tenant in its legend.
func TestPlotRun(t *testing.T) {
	sc, _ := simulator.Lookup("seed002")
	w, err := simulator.Generate(sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := simulator.PolicyByName("wfq-tokens")
	res, err := simulator.Run(w, p)
	if err != nil {
		t.Fatal(err)
	}
	files, err := plotRun(t.TempDir(), res)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("wrote %v, want 2 charts", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(strings.NewReader(string(b)))
		for {
			if _, err := d.Token(); err != nil {
				if err.Error() != "EOF" {
					t.Fatalf("%s is not well-formed SVG: %v", f, err)
				}
				break
			}
		}
		for _, tn := range sc.Tenants {
			if !strings.Contains(string(b), tn.Name) {
				t.Errorf("%s does not name tenant %s", f, tn.Name)
			}
		}
	}
}
