package caddyfairqueue

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

func TestObserveRefusal(t *testing.T) {
	const queue = "test-refusal"
	histogram := func(moment string) (uint64, float64) {
		var m dto.Metric
		if err := budgetLeftRatio.WithLabelValues(queue, moment).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	counter := func(moment string) float64 {
		var m dto.Metric
		if err := budgetRefusals.WithLabelValues(queue, "a", moment).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	observeRefusal(queue, "a", &fairqueue.Rejection{Reason: fairqueue.ReasonBudgetExceeded, BudgetLeft: 1})
	observeRefusal(queue, "a", &fairqueue.Rejection{Reason: fairqueue.ReasonBudgetExceeded, WhileQueued: true, BudgetLeft: 0.75})
	observeRefusal(queue, "a", &fairqueue.Rejection{Reason: fairqueue.ReasonBudgetExceeded, WhileQueued: true, BudgetLeft: 0.5})
	observeRefusal(queue, "a", &fairqueue.Rejection{Reason: fairqueue.ReasonQueueTimeout}) // not a refusal
	if got := counter(momentAtAdmission); got != 1 {
		t.Errorf("at_admission: %v, want 1", got)
	}
	if got := counter(momentWhileQueued); got != 2 {
		t.Errorf("while_queued: %v, want 2", got)
	}
	if n, sum := histogram(momentWhileQueued); n != 2 || sum != 1.25 {
		t.Errorf("while_queued budget left: %d observations summing %v, want 2 summing 1.25", n, sum)
	}
	if n, sum := histogram(momentAtAdmission); n != 1 || sum != 1 {
		t.Errorf("at_admission budget left: %d observations summing %v, want 1 summing 1", n, sum)
	}
}

func TestRejectionWhileQueuedMessage(t *testing.T) {
	for _, queued := range []bool{false, true} {
		e := rejectionError(&fairqueue.Rejection{Reason: fairqueue.ReasonBudgetExceeded, WhileQueued: queued, Detail: "x"})
		if e.status != http.StatusServiceUnavailable || e.code != "wait_budget_exceeded" {
			t.Fatalf("while queued %v: %d %s", queued, e.status, e.code)
		}
		if got := strings.Contains(e.message, "It was not queued"); got == queued {
			t.Errorf("while queued %v: message %q", queued, e.message)
		}
	}
}
