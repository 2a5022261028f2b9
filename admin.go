package caddyfairqueue

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(adminReport{})
}

// adminReport provides the /fair_queue/report endpoint of the Caddy admin
// API: a per-tenant report of every live fair queue. Caddy loads every
// admin.api.* module; no config is needed.
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
	// Tenants is one page of the remembered tenants, sorted by name:
	// the first limit after the cursor (see handleReport).
	Tenants []tenantReport `json:"tenants"`
	// TenantsTotal is how many tenants the queue remembers.
	TenantsTotal int `json:"tenants_total"`
	// NextCursor, when set, fetches the next page: ?queue=NAME&cursor=….
	NextCursor string `json:"next_cursor,omitempty"`
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
	return []caddy.AdminRoute{{Pattern: "/fair_queue/report", Handler: caddy.AdminHandlerFunc(a.handleReport)}}
}

// Tenants per queue in one answer of the report, by default and at most
// (?limit=N): a queue can remember 100k of them.
const (
	reportDefaultLimit = 100
	reportMaxLimit     = 1000
)

// handleReport answers GET with a JSON array of the live queues, sorted
// by name; ?queue=NAME limits it to that queue (404 if it is not live).
// Each queue lists one page of its tenants, sorted by name: ?limit=N
// (default 100, at most 1000) of them, after ?cursor=C, the next_cursor
// of the previous page (which needs ?queue=, a cursor being one queue's).
func (adminReport) handleReport(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed")}
	}
	query := r.URL.Query()
	only := query.Get("queue")
	page, err := parsePage(query.Get("limit"), query.Get("cursor"), only != "")
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}

	live := liveQueues()
	if only != "" {
		live = slices.DeleteFunc(live, func(s *sharedQueue) bool { return s.name != only })
		if len(live) == 0 {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown queue: %q", only)}
		}
	}

	results := make([]queueReport, 0, len(live))
	for _, s := range live {
		results = append(results, reportQueue(s, page))
	}

	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(results); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	return nil
}

// reportPage is which tenants a report lists: up to limit, with names
// after after (all when !cursor).
type reportPage struct {
	limit  int
	after  string
	cursor bool
}

// parsePage reads ?limit= and ?cursor=, the last name of the previous
// page, base64url-encoded.
func parsePage(limit, cursor string, oneQueue bool) (reportPage, error) {
	p := reportPage{limit: reportDefaultLimit}
	if limit != "" {
		n, err := strconv.Atoi(limit)
		if err != nil || n < 1 || n > reportMaxLimit {
			return p, fmt.Errorf("limit: want a number of tenants from 1 to %d, got %q", reportMaxLimit, limit)
		}
		p.limit = n
	}
	if cursor != "" {
		if !oneQueue {
			return p, fmt.Errorf("cursor: a cursor pages one queue's tenants; name the queue too (?queue=NAME&cursor=…)")
		}
		b, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil {
			return p, fmt.Errorf("cursor: %q is not a next_cursor this report gave", cursor)
		}
		p.after, p.cursor = string(b), true
	}
	return p, nil
}

// reportQueue builds the report of one queue from a snapshot of its
// state, with the page of its tenants. Shares are of every tenant's, not
// of the page's.
func reportQueue(s *sharedQueue, page reportPage) queueReport {
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
		TenantsTotal:     len(st.Tenants),
	}
	var served, weights float64
	for _, t := range st.Tenants {
		served += t.Served
		weights += t.Weight
	}
	first := 0
	if page.cursor {
		first = sort.Search(len(st.Tenants), func(i int) bool { return st.Tenants[i].Name > page.after })
	}
	listed := st.Tenants[first:min(first+page.limit, len(st.Tenants))]
	qr.Tenants = make([]tenantReport, 0, len(listed))
	if first+len(listed) < len(st.Tenants) {
		qr.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(listed[len(listed)-1].Name))
	}
	for _, t := range listed {
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
