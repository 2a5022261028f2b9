// Command sim replays a scenario under several scheduling policies on a
// virtual clock and prints one table block per policy.
//
//	go run ./fairqueue/sim -scenario seed000 [-policy all|fifo,wfq-tokens] [-seed N]
//	go run ./fairqueue/sim -scenario list
//
// The model and every metric are documented in package
// fairqueue/simulator.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue/simulator"
)

func main() {
	name := flag.String("scenario", "list", "scenario to run, or \"list\"")
	policy := flag.String("policy", "all", "\"all\" or a comma-separated list of policies")
	seed := flag.Uint64("seed", 1, "random seed of the workload")
	flag.Parse()
	if err := run(*name, *policy, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(2)
	}
}

func run(name, policy string, seed uint64) error {
	if name == "list" {
		for _, n := range simulator.Names() {
			sc, _ := simulator.Lookup(n)
			fmt.Printf("%-8s  %s\n", n, sc.Description)
		}
		fmt.Printf("\npolicies: all")
		for _, p := range simulator.Policies() {
			fmt.Printf(", %s", p.Name())
		}
		fmt.Println()
		return nil
	}
	sc, ok := simulator.Lookup(name)
	if !ok {
		return fmt.Errorf("unknown scenario %q (try -scenario list)", name)
	}
	var policies []simulator.Policy
	if policy == "all" {
		policies = simulator.Policies()
	} else {
		for _, n := range strings.Split(policy, ",") {
			p, ok := simulator.PolicyByName(strings.TrimSpace(n))
			if !ok {
				return fmt.Errorf("unknown policy %q", n)
			}
			policies = append(policies, p)
		}
	}
	start := time.Now()
	w, err := simulator.Generate(sc, seed)
	if err != nil {
		return err
	}
	fmt.Println(w.Summary())
	fmt.Println()
	violations := 0
	for _, p := range policies {
		res, err := simulator.Run(w, p)
		if err != nil {
			return err
		}
		res.Format(os.Stdout)
		fmt.Println()
		violations += res.ViolationCount
	}
	fmt.Printf("wall time %v\n", time.Since(start).Round(time.Millisecond))
	if violations > 0 {
		return fmt.Errorf("%d scheduler invariant violations", violations)
	}
	return nil
}
