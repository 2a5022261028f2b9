package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(adminReport{})
}

// adminReport is a module that provides the /fair_queue/report endpoint
// for the Caddy admin API: a per-tenant report of every live fair queue,
// so fairness can be checked without a metrics stack. Caddy loads every
// admin.api.* module when it starts its admin server; no config is needed.
type adminReport struct{}

// queueReport is one live queue in the report.
type queueReport struct {
	Name             string  `json:"name"`
	HealthyUpstreams int     `json:"healthy_upstreams"`
	Capacity         int     `json:"capacity"`
	TokenCapacity    int64   `json:"token_capacity"`
	Queued           int     `json:"queued"`
	QueuedTokens     int64   `json:"queued_tokens"`
	Inflight         int     `json:"inflight"`
	BoostedInflight  int     `json:"boosted_inflight"`
	Water            float64 `json:"water"`
	DegradeLevel     int     `json:"degrade_level"`
	// CostModel is the learned cost model's fit (coefficients in seconds,
	// R², the implied token_to_qps_weight); see cost_unit learned.
	CostModel costModelReport `json:"cost_model"`
	Tenants   []tenantReport  `json:"tenants"`
}

// tenantReport is one tenant the queue currently remembers. Undeclared
// tenants appear under their own name with Declared false (unlike metrics,
// which fold them into one label).
type tenantReport struct {
	Name         string  `json:"name"`
	Declared     bool    `json:"declared"`
	Weight       float64 `json:"weight"`
	Queued       int     `json:"queued"`
	QueuedTokens int64   `json:"queued_tokens"`
	Inflight     int     `json:"inflight"`
	// ServedTokens is the cost charged so far, in the queue's cost unit
	// (tokens, or requests with cost_unit requests).
	ServedTokens float64 `json:"served_tokens"`
	// Share is ServedTokens over the sum of all listed tenants' (0 when
	// nothing was served yet).
	Share float64 `json:"share"`
	// WeightedFairShare is Weight over the sum of all listed tenants'.
	WeightedFairShare float64 `json:"weighted_fair_share"`
	VirtualTime       float64 `json:"virtual_time"`
}

// CaddyModule returns the Caddy module information.
func (adminReport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.fair_queue",
		New: func() caddy.Module { return new(adminReport) },
	}
}

// Routes returns a route for the /fair_queue/report endpoint.
func (a adminReport) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{
			Pattern: "/fair_queue/report",
			Handler: caddy.AdminHandlerFunc(a.handleReport),
		},
	}
}

// handleReport answers GET with a JSON array of the live queues, sorted
// by name; ?queue=NAME limits it to that queue (404 if it is not live).
func (adminReport) handleReport(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{
			HTTPStatus: http.StatusMethodNotAllowed,
			Err:        fmt.Errorf("method not allowed"),
		}
	}
	only := r.URL.Query().Get("queue")

	// Collect the queues first, so the pool's lock is not held while each
	// queue's own lock is taken.
	var live []*sharedQueue
	queues.Range(func(_, value any) bool {
		if s, ok := value.(*sharedQueue); ok && s != nil && (only == "" || s.name == only) {
			live = append(live, s)
		}
		return true
	})
	if only != "" && len(live) == 0 {
		return caddy.APIError{
			HTTPStatus: http.StatusNotFound,
			Err:        fmt.Errorf("unknown queue: %q", only),
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].name < live[j].name })

	results := make([]queueReport, 0, len(live))
	for _, s := range live {
		results = append(results, reportQueue(s))
	}

	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(results); err != nil {
		return caddy.APIError{
			HTTPStatus: http.StatusInternalServerError,
			Err:        err,
		}
	}
	return nil
}

// reportQueue builds the report of one queue from a snapshot of its state.
func reportQueue(s *sharedQueue) queueReport {
	st := s.q.Stats(true) // tenants sorted by name
	qr := queueReport{
		Name:             s.name,
		HealthyUpstreams: st.Healthy,
		Capacity:         st.Capacity,
		TokenCapacity:    st.TokenCapacity,
		Queued:           st.Queued,
		QueuedTokens:     st.QueuedCost,
		Inflight:         st.Inflight,
		BoostedInflight:  st.BoostedInflight,
		Water:            st.Water,
		DegradeLevel:     s.q.DegradeLevel(),
		CostModel:        newCostModelReport(s.cost.Fit()),
		Tenants:          make([]tenantReport, 0, len(st.Tenants)),
	}
	var served, weights float64
	for _, t := range st.Tenants {
		served += t.Served
		weights += t.Weight
	}
	for _, t := range st.Tenants {
		tr := tenantReport{
			Name:         t.Name,
			Declared:     t.Known,
			Weight:       t.Weight,
			Queued:       t.Queued,
			QueuedTokens: t.QueuedCost,
			Inflight:     t.Inflight,
			ServedTokens: t.Served,
			VirtualTime:  t.VirtualTime,
		}
		if served > 0 {
			tr.Share = t.Served / served
		}
		if weights > 0 {
			tr.WeightedFairShare = t.Weight / weights
		}
		qr.Tenants = append(qr.Tenants, tr)
	}
	return qr
}

// Interface guards
var (
	_ caddy.Module      = (*adminReport)(nil)
	_ caddy.AdminRouter = (*adminReport)(nil)
)
