// Command fqsim replays a scenario under several scheduling policies on a
// virtual clock and prints a table per policy, then the scenario's
// comparisons. The model and the metrics are documented in package
// fairqueue/simulator.
//
//	go -C cmd/fqsim run . -scenario seed000 [-policy all|budgets|fifo,wfq-tokens] [-seed N] [-plot DIR]
//	go -C cmd/fqsim run . -scenario list
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
	policy := flag.String("policy", "", "\"all\" (the standard policies), \"budgets\" (the wait-budget policies), or a comma-separated list; default: the scenario's own")
	seed := flag.Uint64("seed", 1, "random seed of the workload")
	plotDir := flag.String("plot", "", "write SVG charts of each run (wait CDF per tenant, shares over time) to this directory")
	flag.Parse()
	if err := run(*name, *policy, *seed, *plotDir); err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(2)
	}
}

func run(name, policy string, seed uint64, plotDir string) error {
	if name == "list" {
		list()
		return nil
	}
	sc, ok := simulator.Lookup(name)
	if !ok {
		return fmt.Errorf("unknown scenario %q (try -scenario list)", name)
	}
	policies, err := choosePolicies(sc, policy)
	if err != nil {
		return err
	}
	start := time.Now()
	w, err := simulator.Generate(sc, seed)
	if err != nil {
		return err
	}
	fmt.Println(w.Summary())
	fmt.Println()
	violations := 0
	var budgets []*simulator.Result
	for _, p := range policies {
		res, err := simulator.Run(w, p)
		if err != nil {
			return err
		}
		if err := report(res, plotDir); err != nil {
			return err
		}
		if res.Budgets {
			budgets = append(budgets, res)
		}
		violations += res.ViolationCount
	}
	if err := compare(w, budgets); err != nil {
		return err
	}
	fmt.Printf("wall time %v\n", time.Since(start).Round(time.Millisecond))
	if violations > 0 {
		return fmt.Errorf("%d scheduler invariant violations", violations)
	}
	return nil
}

// list prints the scenarios and the policies.
func list() {
	for _, n := range simulator.Names() {
		sc, _ := simulator.Lookup(n)
		fmt.Printf("%-14s  %s\n", n, sc.Description)
	}
	fmt.Printf("\npolicies: all")
	for _, p := range simulator.Policies() {
		fmt.Printf(", %s", p.Name())
	}
	fmt.Printf("\nbudget policies: budgets")
	for _, p := range simulator.BudgetPolicies() {
		fmt.Printf(", %s", p.Name())
	}
	fmt.Println()
}

// choosePolicies resolves -policy: "all", "budgets", a comma-separated
// list, or "" for the scenario's own (the standard ones if it has none).
func choosePolicies(sc *simulator.Scenario, policy string) ([]simulator.Policy, error) {
	switch {
	case policy == "all" || policy == "" && len(sc.Policies) == 0:
		return simulator.Policies(), nil
	case policy == "budgets":
		return simulator.BudgetPolicies(), nil
	}
	names := sc.Policies
	if policy != "" {
		names = strings.Split(policy, ",")
	}
	var policies []simulator.Policy
	for _, n := range names {
		p, ok := simulator.PolicyByName(strings.TrimSpace(n))
		if !ok {
			return nil, fmt.Errorf("unknown policy %q", n)
		}
		policies = append(policies, p)
	}
	return policies, nil
}

// report prints one policy's run: its table, charts, degrade timeline,
// circuit events and, for wfq-budgets, the health changes' effects.
func report(res *simulator.Result, plotDir string) error {
	res.Format(os.Stdout)
	fmt.Println()
	if plotDir != "" {
		files, err := plotRun(plotDir, res)
		if err != nil {
			return fmt.Errorf("plotting: %w", err)
		}
		fmt.Printf("charts: %s\n\n", strings.Join(files, ", "))
	}
	if len(res.Transitions) > 0 || len(res.Timeline) > 0 {
		simulator.FormatTimeline(os.Stdout, res, 5*time.Second)
		fmt.Println()
	}
	for _, ev := range res.CircuitEvents {
		fmt.Printf("%8v  %s\n", ev.At.Sub(simulator.Epoch).Round(time.Millisecond), ev)
		for _, c := range ev.Callers {
			fmt.Printf("          caller %s: %.0f cost/s, %.1f%% of capacity\n", c.Tenant, c.Demand, 100*c.Share)
		}
	}
	if res.Budgets && len(res.Scenario.Health) > 0 && res.Policy == simulator.WFQBudgets {
		simulator.FormatHealth(os.Stdout, res, 5*time.Second, 20*time.Second)
		fmt.Println()
	}
	return nil
}

// compare prints the wait-budget runs side by side, then seed003's
// provider-account measures or seed004's quota limiters.
func compare(w *simulator.Workload, budgets []*simulator.Result) error {
	if len(budgets) > 0 {
		simulator.FormatBudgets(os.Stdout, budgets)
		fmt.Println()
	}
	switch w.Scenario.Name {
	case "seed003":
		var reps []simulator.Seed003Report
		for _, res := range budgets {
			reps = append(reps, simulator.Seed003Measure(res))
		}
		simulator.FormatSeed003(os.Stdout, reps)
		fmt.Println()
	case "seed004":
		var quotas []*simulator.Seed004Result
		for _, m := range simulator.QuotaModes {
			r, err := simulator.RunSeed004(w, m)
			if err != nil {
				return err
			}
			quotas = append(quotas, r)
		}
		simulator.FormatSeed004(os.Stdout, quotas)
		fmt.Println()
	}
	return nil
}
