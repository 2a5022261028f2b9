// Fair queue dashboard: polls api/state and draws it. Every number shown
// comes from that JSON; cells carry the raw value in data-value and the
// field it came from in data-field, so a test can check them. Text goes in
// with textContent only: tenant names are whatever clients sent.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const W = 640, H = 220, PAD = {l: 44, r: 12, t: 12, b: 26};
  const OUTCOME_COLORS = {
    served: "#2e7d32", wait_budget_exceeded: "#f9a825", queue_timeout: "#ef6c00",
    quota_exceeded: "#6a1b9a", circuit_open: "#c62828", tenant_queue_full: "#ad1457",
    class_throttled: "#8d6e63", server_busy: "#d84315", context_length_exceeded: "#5d4037",
    invalid_request: "#546e7a", request_too_large: "#455a64", request_timeout: "#78909c",
    unknown_tenant: "#37474f", proxy_error: "#b71c1c", client_gone: "#90a4ae", other: "#bdbdbd",
  };
  const WINDOW_WORDS = {"5m": "5 min", "1h": "1 h", "24h": "24 h"};
  const METER_WORDS = {qps: "requests", tokens: "tokens", joint: "joint (requests + tokens)"};
  // Why the cost model has no fit yet, by its status.
  const FIT_WORDS = {
    warming_up: "not fitted yet: too few requests served",
    flat_prompt: "not fitted: the prompts were all about the same length, so time per prompt token cannot be told from time per request",
    flat_completion: "not fitted: the outputs were all about the same length",
    collinear: "not fitted: prompt and output lengths rose and fell together",
    no_completion_time: "not fitted: output length showed no effect on busy time",
  };

  const state = {
    window: new URLSearchParams(location.search).get("window") || "5m",
    queue: new URLSearchParams(location.search).get("queue") || "",
    refresh: 3000,
    timer: 0,
    inflight: false,
    again: false,
  };

  // ---------------------------------------------------------- helpers

  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  // Display formats, one per kind of number: a test reads them back.
  const fmt = {
    int: (v) => String(Math.round(v)),
    ms: (v) => (v * 1000).toFixed(1),
    pct: (v) => (v * 100).toFixed(1) + "%",
    rate: (v) => v.toFixed(2),
    ratio: (v) => v.toFixed(3),
    bytes: (v) => (v / 1048576).toFixed(2) + " MiB",
  };

  // Times, all in the locale's one format (its 12- or 24-hour clock):
  // with seconds over an hour or less, without beyond, the date added to
  // a 24 h window's table.
  const timeFmt = {
    second: new Intl.DateTimeFormat(undefined, {hour: "numeric", minute: "2-digit", second: "2-digit"}),
    minute: new Intl.DateTimeFormat(undefined, {hour: "numeric", minute: "2-digit"}),
    day: new Intl.DateTimeFormat(undefined, {month: "short", day: "numeric", hour: "numeric", minute: "2-digit", second: "2-digit"}),
  };

  // timeEl makes an element showing time t (ms) in format f, with the
  // instant in data-time.
  function timeEl(tag, t, f, attrs) {
    const e = el(tag, attrs || {}, f.format(new Date(t)));
    e.dataset.time = new Date(t).toISOString();
    return e;
  }

  // cell makes a table cell showing value v in format f, with the raw value
  // and its JSON field in data attributes.
  function cell(field, v, f) {
    const td = el("td", {"data-field": field, "data-value": String(v)}, f(v));
    td.className = "num";
    return td;
  }

  // nameCell shows a tenant name, cut with an ellipsis by the style when
  // long, the whole name on hover.
  function nameCell(name, extra) {
    return el("td", {class: "name", title: name + (extra || "")}, name + (extra || ""));
  }

  function setValue(id, field, v, f) {
    const e = $(id);
    e.dataset.field = field;
    e.dataset.value = String(v);
    e.textContent = f(v);
  }

  // fitText shortens an SVG text element to width user units, ending it
  // with an ellipsis, and gives it the whole text as its tooltip.
  function fitText(t, full, width) {
    t.textContent = full;
    t.appendChild(svg("title", {}, full));
    t.dataset.full = full;
    if (t.getComputedTextLength() <= width) return;
    let n = full.length;
    while (n > 1) {
      n--;
      t.firstChild.nodeValue = full.slice(0, n) + "…";
      if (t.getComputedTextLength() <= width) break;
    }
  }

  // frame draws axes for a chart over [t0, t1] x [0, ymax] and returns
  // the coordinate mappers.
  function frame(root, t0, t1, ymax, yfmt) {
    clear(root);
    // A minute's point starts before the history when it began mid-minute:
    // keep it on the plot's edge.
    const x = (t) => PAD.l + (W - PAD.l - PAD.r) * Math.max(t - t0, 0) / Math.max(t1 - t0, 1);
    const y = (v) => H - PAD.b - (H - PAD.t - PAD.b) * v / (ymax || 1);
    root.appendChild(svg("rect", {x: PAD.l, y: PAD.t, width: W - PAD.l - PAD.r, height: H - PAD.t - PAD.b, class: "plot"}));
    for (let i = 0; i <= 4; i++) {
      const v = ymax * i / 4;
      root.appendChild(svg("line", {x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v), class: "grid"}));
      root.appendChild(svg("text", {x: PAD.l - 4, y: y(v) + 4, class: "axis", "text-anchor": "end"}, yfmt(v)));
    }
    timeAxis(root, t0, t1, x, H - 8);
    return {x, y};
  }

  // timeAxis labels five instants of [t0, t1] at height y.
  function timeAxis(root, t0, t1, x, y) {
    const f = t1 - t0 > 3600e3 ? timeFmt.minute : timeFmt.second;
    for (let i = 0; i <= 4; i++) {
      const t = t0 + (t1 - t0) * i / 4;
      const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
      const e = svg("text", {x: x(t), y: y, class: "axis time", "text-anchor": anchor}, f.format(new Date(t)));
      e.dataset.time = new Date(t).toISOString();
      root.appendChild(e);
    }
  }

  // pathOf joins points into a path, breaking it where samples are
  // missing (more than two steps apart).
  function pathOf(points, x, y, step) {
    let d = "", prev = null;
    for (const p of points) {
      const cmd = prev === null || p.t - prev > 2 * step ? "M" : "L";
      d += cmd + x(p.t).toFixed(1) + "," + y(p.v).toFixed(1) + " ";
      prev = p.t;
    }
    return d.trim();
  }

  // ---------------------------------------------------------- gateway

  function drawGateway(st) {
    const g = st.gateway;
    setValue("gw-capacity", "gateway.capacity", g.capacity, fmt.int);
    setValue("gw-healthy", "gateway.healthy_upstreams", g.healthy_upstreams, fmt.int);
    setValue("gw-queued", "gateway.queued", g.queued, fmt.int);
    setValue("gw-inflight", "gateway.inflight", g.inflight, fmt.int);
    setValue("gw-water", "gateway.water", g.water, fmt.ratio);
    setValue("gw-degrade", "gateway.degrade_level", g.degrade_level, fmt.int);
    setValue("gw-circuit", "gateway.circuit.level", g.circuit.level, fmt.int);
    if (st.jain_tenants > 0 && st.jain > 0) {
      setValue("jain", "jain", st.jain, fmt.ratio);
    } else {
      setValue("jain", "jain", st.jain, () => "—");
    }
    setValue("mem", "history_memory_bytes", st.history_memory_bytes, fmt.bytes);
    drawCostModel(g);

    // The time axis covers what the history holds (a gateway started a
    // minute ago has no 24 hours to draw), at least 30 s.
    const now = Date.parse(st.now), t0 = now - Math.min(st.window_seconds, Math.max(st.span_seconds, 30)) * 1000;
    const step = st.resolution_seconds * 1000;
    const series = st.series.map((p) => ({t: Date.parse(p.at), p}));

    // Water with the ladder's lines.
    const wroot = $("chart-water");
    let ymax = 1;
    for (const s of series) ymax = Math.max(ymax, s.p.water_max);
    const w = frame(wroot, t0, now, ymax, (v) => v.toFixed(2));
    for (const s of g.ladder) {
      wroot.appendChild(svg("line", {x1: PAD.l, x2: W - PAD.r, y1: w.y(s.trigger), y2: w.y(s.trigger), class: "line-trigger", "data-step": s.name}));
      wroot.appendChild(svg("line", {x1: PAD.l, x2: W - PAD.r, y1: w.y(s.recover), y2: w.y(s.recover), class: "line-recover", "data-step": s.name}));
      wroot.appendChild(svg("text", {x: W - PAD.r - 2, y: w.y(s.trigger) - 3, class: "line-label", "text-anchor": "end"},
        s.name + " trigger " + s.trigger + " / recover " + s.recover));
    }
    const wd = pathOf(series.map((s) => ({t: s.t, v: s.p.water_max})), w.x, w.y, step);
    if (wd) wroot.appendChild(svg("path", {d: wd, class: "series water"}));
    for (const s of series) {
      if (s.p.degrade_max > 0) {
        wroot.appendChild(svg("circle", {cx: w.x(s.t), cy: w.y(s.p.water_max), r: 2, class: "degraded"}));
      }
    }

    // Capacity (slots) and healthy upstreams (count) on one integer axis.
    const croot = $("chart-capacity");
    let cmax = 1, hmax = 1;
    for (const s of series) { cmax = Math.max(cmax, s.p.capacity); hmax = Math.max(hmax, s.p.healthy); }
    const c = frame(croot, t0, now, Math.ceil(Math.max(cmax, hmax) * 1.25 / 4) * 4, fmt.int);
    const cd = pathOf(series.map((s) => ({t: s.t, v: s.p.capacity})), c.x, c.y, step);
    if (cd) croot.appendChild(svg("path", {d: cd, class: "series capacity"}));
    const hd = pathOf(series.map((s) => ({t: s.t, v: s.p.healthy})), c.x, c.y, step);
    if (hd) croot.appendChild(svg("path", {d: hd, class: "series healthy"}));
    croot.appendChild(svg("text", {x: PAD.l + 6, y: PAD.t + 14, class: "legend-text capacity"}, "capacity, slots (max " + cmax + ")"));
    croot.appendChild(svg("text", {x: PAD.l + 6, y: PAD.t + 28, class: "legend-text healthy"}, "healthy upstreams (max " + hmax + ")"));

    // Ladder and circuit tables.
    const lb = $("ladder").tBodies[0];
    clear(lb);
    if (g.ladder.length === 0) lb.appendChild(rowOf([el("td", {colspan: 5, class: "muted"}, "no degrade ladder configured")]));
    for (const s of g.ladder) {
      lb.appendChild(rowOf([el("td", {}, s.name), cell("trigger", s.trigger, fmt.ratio), cell("recover", s.recover, fmt.ratio),
        el("td", {}, s.action), el("td", {class: s.engaged ? "bad" : "ok"}, s.engaged ? "engaged" : "normal")], {"data-step": s.name}));
    }
    const cb = $("circuit").tBodies[0];
    clear(cb);
    const ci = g.circuit;
    $("circuit-lines").textContent = ci.configured ?
      "(trigger " + ci.trigger + "× capacity, recover " + ci.recover + "×; capacity " + ci.capacity.toFixed(1) + " units/s)" : "";
    if (!ci.configured) cb.appendChild(rowOf([el("td", {colspan: 3, class: "muted"}, "no circuit_break configured")]));
    for (const t of ci.tiers) {
      cb.appendChild(rowOf([el("td", {}, t.name), el("td", {class: t.shed ? "bad" : "ok"}, t.shed ? "shed" : "admitted"),
        cell("demand", t.demand, fmt.rate)], {"data-tier": t.name}));
    }
    if (ci.configured) cb.appendChild(rowOf([el("td", {class: "muted"}, "(no tier)"), el("td", {class: "ok"}, "never shed"),
      cell("tierless_demand", ci.tierless_demand, fmt.rate)]));

    drawTimeline(st, t0, now);
  }

  // drawCostModel writes the learned cost model in words: milliseconds of
  // upstream busy time per request, per 1000 prompt tokens and per output
  // token, R², whether it prices requests, and which quotas weigh tokens
  // by its token_to_qps_weight.
  function drawCostModel(g) {
    const cm = g.cost_model;
    const part = (id, field, v, words) => setValue(id, "gateway.cost_model." + field, v, (x) => cm.ready ? words(x) : "");
    part("cm-overhead", "overhead_seconds", cm.overhead_seconds, (v) => (1000 * v).toFixed(1) + " ms per request");
    part("cm-prompt", "prompt_token_seconds", cm.prompt_token_seconds, (v) => "+ " + (1e6 * v).toFixed(2) + " ms per 1k prompt tokens");
    part("cm-completion", "completion_token_seconds", cm.completion_token_seconds, (v) => "+ " + (1000 * v).toFixed(2) + " ms per output token");
    const use = g.cost_unit === "learned" ? "prices requests (cost_unit learned)" : "reported only (cost_unit " + g.cost_unit + ")";
    setValue("cm-fit", "gateway.cost_model.r2", cm.r2, (v) => cm.ready ?
      "R² " + v.toFixed(3) + " over " + cm.samples + " served; " + use :
      (FIT_WORDS[cm.status] || cm.status) + " (" + cm.samples + " served so far)");
    setValue("gw-tokenweight", "gateway.cost_model.token_to_qps_weight", cm.token_to_qps_weight, (v) => cm.ready ? v.toPrecision(3) : "—");
    const auto = g.learned_weight_tenants || [];
    const note = $("gw-tokenweight-use");
    note.dataset.field = "gateway.learned_weight_tenants";
    note.dataset.value = auto.join(",");
    note.textContent = auto.length ?
      "applies to the joint quota of " + auto.join(", ") + " (token_to_qps_weight auto); other quotas use their configured weight" :
      "not applied: every quota uses its configured token_to_qps_weight (in the quota table)";
  }

  function rowOf(cells, attrs) {
    const tr = el("tr", attrs || {});
    for (const c of cells) tr.appendChild(c);
    return tr;
  }

  function drawTimeline(st, t0, t1) {
    const root = $("chart-timeline");
    clear(root);
    const th = 90;
    const x = (t) => PAD.l + (W - PAD.l - PAD.r) * (t - t0) / Math.max(t1 - t0, 1);
    root.appendChild(svg("rect", {x: PAD.l, y: 8, width: W - PAD.l - PAD.r, height: th - 34, class: "plot"}));
    root.appendChild(svg("text", {x: PAD.l - 4, y: 24, class: "axis", "text-anchor": "end"}, "degrade"));
    root.appendChild(svg("text", {x: PAD.l - 4, y: 52, class: "axis", "text-anchor": "end"}, "circuit"));
    timeAxis(root, t0, t1, x, th - 8);
    const tb = $("transitions").tBodies[0];
    clear(tb);
    if (st.transitions.length === 0) {
      tb.appendChild(rowOf([el("td", {colspan: 6, class: "muted"}, "no transitions in this window")]));
    }
    for (const tr of st.transitions) {
      const t = Date.parse(tr.at), cy = tr.kind === "degrade" ? 20 : 48;
      const m = svg(tr.up ? "polygon" : "circle", {class: "mark " + tr.kind + (tr.up ? " up" : " down")});
      if (tr.up) {
        const cx = x(t);
        m.setAttribute("points", cx + "," + (cy - 6) + " " + (cx - 5) + "," + (cy + 4) + " " + (cx + 5) + "," + (cy + 4));
      } else {
        m.setAttribute("cx", x(t)); m.setAttribute("cy", cy); m.setAttribute("r", 4);
      }
      m.appendChild(svg("title", {}, tr.kind + " " + tr.name + " " + direction(tr) + " at " + timeFmt.second.format(new Date(t))));
      root.appendChild(m);
    }
    const f = st.window_seconds > 3600 ? timeFmt.day : timeFmt.second;
    for (const tr of st.transitions.slice().reverse()) {
      tb.appendChild(rowOf([timeEl("td", Date.parse(tr.at), f), el("td", {}, tr.kind),
        el("td", {}, tr.name), el("td", {class: tr.up ? "bad" : "ok"}, direction(tr)),
        el("td", {}, tr.from + " → " + tr.to), cell("value", tr.value, fmt.ratio)], {"data-kind": tr.kind}));
    }
  }

  function direction(tr) {
    if (tr.kind === "degrade") return tr.up ? "engaged" : "released";
    return tr.up ? "shed" : "readmitted";
  }

  // ---------------------------------------------------------- tenants

  // windowWords says what the numbers cover: the window, or as much of
  // it as the history holds.
  function windowWords(st) {
    const words = WINDOW_WORDS[st.window] || st.window;
    if (st.span_seconds < st.window_seconds) {
      return "over the " + Math.round(st.span_seconds) + " s the history covers (of the " + words + " window)";
    }
    return "over the last " + words;
  }

  function drawTenants(st) {
    $("window-label").textContent = windowWords(st);
    const budget = st.gateway.boost_budget_hourly;
    $("boosts-head").textContent = budget > 0 ? "boosts (of " + budget + " per h each)" : "boosts";
    const tb = $("tenants").tBodies[0];
    clear(tb);
    for (const t of st.tenants) {
      const active = t.requests > 0;
      tb.appendChild(rowOf([
        nameCell(t.name, t.declared ? "" : " (undeclared)"),
        cell("weight", t.weight, (v) => String(v)),
        cell("requests", t.requests, fmt.int),
        cell("success_rate", t.success_rate, active ? fmt.pct : () => "—"),
        cell("served", t.served, fmt.int),
        cell("wait.p50", t.wait.p50, fmt.ms),
        cell("wait.p95", t.wait.p95, fmt.ms),
        cell("wait.p99", t.wait.p99, fmt.ms),
        cell("share", t.share, fmt.pct),
        cell("fair_share", t.fair_share, fmt.pct),
        cell("requests_per_sec", t.requests_per_sec, fmt.rate),
        cell("served_tokens_per_sec", t.served_tokens_per_sec, fmt.rate),
        cell("boosts", t.boosts, fmt.int),
        cell("eta.mean_ratio", t.eta.mean_ratio, t.eta.count > 0 ? fmt.ratio : () => "—"),
        cell("eta.mean_abs_log_error", t.eta.mean_abs_log_error, t.eta.count > 0 ? (v) => Math.exp(v).toFixed(3) : () => "—"),
        cell("queued", t.queued, fmt.int),
        cell("inflight", t.inflight, fmt.int),
      ], {"data-tenant": t.name}));
    }
    drawShares(st);
    drawOutcomes(st);
    drawHistograms(st);
    drawQuota(st);
  }

  function bandChart(root, n) {
    clear(root);
    root.appendChild(svg("rect", {x: PAD.l, y: PAD.t, width: W - PAD.l - PAD.r, height: H - PAD.t - PAD.b, class: "plot"}));
    const band = (W - PAD.l - PAD.r) / Math.max(n, 1);
    return {band, x0: (i) => PAD.l + band * i};
  }

  function drawShares(st) {
    const root = $("chart-shares");
    const ts = st.tenants;
    const b = bandChart(root, ts.length);
    let ymax = 0.01;
    for (const t of ts) ymax = Math.max(ymax, t.share, t.fair_share);
    const y = (v) => H - PAD.b - (H - PAD.t - PAD.b) * v / ymax;
    for (let i = 0; i <= 4; i++) {
      const v = ymax * i / 4;
      root.appendChild(svg("line", {x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v), class: "grid"}));
      root.appendChild(svg("text", {x: PAD.l - 4, y: y(v) + 4, class: "axis", "text-anchor": "end"}, fmt.pct(v)));
    }
    ts.forEach((t, i) => {
      const bw = Math.min(b.band * 0.35, 40), cx = b.x0(i) + b.band / 2;
      const share = svg("rect", {x: cx - bw, y: y(t.share), width: bw, height: y(0) - y(t.share), class: "bar share", "data-tenant": t.name});
      share.appendChild(svg("title", {}, t.name + ": " + fmt.pct(t.share) + " of served tokens"));
      root.appendChild(share);
      const fair = svg("rect", {x: cx, y: y(t.fair_share), width: bw, height: y(0) - y(t.fair_share), class: "bar fair", "data-tenant": t.name});
      fair.appendChild(svg("title", {}, t.name + ": fair share " + fmt.pct(t.fair_share) + " (what WFQ owed it)"));
      root.appendChild(fair);
      const label = svg("text", {x: cx, y: H - 8, class: "axis tenant-label", "text-anchor": "middle", "data-tenant": t.name});
      root.appendChild(label);
      fitText(label, t.name, b.band - 6);
    });
  }

  function drawOutcomes(st) {
    const root = $("chart-outcomes");
    const ts = st.tenants;
    clear(root);
    const rowH = Math.min(28, (H - PAD.t - PAD.b) / Math.max(ts.length, 1));
    const left = 110, width = W - left - PAD.r;
    const used = {};
    ts.forEach((t, i) => {
      const y0 = PAD.t + i * rowH;
      const label = svg("text", {x: left - 6, y: y0 + rowH / 2 + 4, class: "axis tenant-label", "text-anchor": "end", "data-tenant": t.name});
      root.appendChild(label);
      fitText(label, t.name, left - 10);
      root.appendChild(svg("rect", {x: left, y: y0 + 3, width: width, height: rowH - 6, class: "plot"}));
      let x = left;
      for (const code of st.outcome_codes) {
        const n = t.outcomes[code] || 0;
        if (n === 0 || t.requests === 0) continue;
        used[code] = true;
        const w = width * n / t.requests;
        const r = svg("rect", {x: x, y: y0 + 3, width: w, height: rowH - 6, fill: OUTCOME_COLORS[code] || "#999",
          class: "outcome", "data-tenant": t.name, "data-outcome": code, "data-value": n});
        r.appendChild(svg("title", {}, t.name + " " + code + ": " + n));
        root.appendChild(r);
        x += w;
      }
    });
    const legend = $("outcome-legend");
    clear(legend);
    for (const code of st.outcome_codes) {
      if (!used[code]) continue;
      const item = el("span", {class: "legend-item"});
      const sw = svg("svg", {width: 10, height: 10, viewBox: "0 0 10 10"});
      sw.appendChild(svg("rect", {width: 10, height: 10, fill: OUTCOME_COLORS[code] || "#999"}));
      item.appendChild(sw);
      item.appendChild(document.createTextNode(" " + code));
      legend.appendChild(item);
    }
  }

  function drawHistograms(st) {
    const box = $("wait-histograms");
    clear(box);
    const bounds = st.bucket_bounds;
    // One bucket range for every tenant: from the first to the last bucket
    // any tenant used, at least ten buckets wide.
    let lo = bounds.length, hi = 0;
    for (const t of st.tenants) {
      t.wait_histogram.forEach((n, i) => { if (n > 0) { lo = Math.min(lo, i); hi = Math.max(hi, i); } });
    }
    if (lo > hi) { lo = 0; hi = 9; }
    while (hi - lo < 9) { if (lo > 0) lo--; else hi++; }
    const label = (i) => i >= bounds.length ? "∞" : bounds[i] < 1 ? (bounds[i] * 1000).toFixed(bounds[i] < 0.01 ? 1 : 0) + "ms" : bounds[i].toFixed(1) + "s";
    for (const t of st.tenants) {
      const fig = el("figure", {class: "hist", "data-tenant": t.name});
      const cap = el("figcaption", {title: t.name}, t.name + " — " + t.wait.count + " served");
      fig.appendChild(cap);
      // The plot sits below a lane for the quantile labels.
      const w = 300, h = 132, l = 28, b = 20, top = 18;
      const root = svg("svg", {viewBox: "0 0 " + w + " " + h, class: "chart", "data-tenant": t.name});
      root.appendChild(svg("rect", {x: l, y: top, width: w - l - 4, height: h - b - top, class: "plot"}));
      const counts = t.wait_histogram.slice(lo, hi + 1);
      const max = Math.max(1, ...counts);
      const bw = (w - l - 4) / counts.length;
      counts.forEach((n, k) => {
        const bh = (h - b - top - 4) * n / max;
        const r = svg("rect", {x: l + k * bw + 1, y: h - b - bh, width: Math.max(bw - 2, 1), height: bh, class: "bar hist-bar", "data-bucket": lo + k, "data-value": n});
        r.appendChild(svg("title", {}, "≤ " + label(lo + k) + ": " + n));
        root.appendChild(r);
      });
      root.appendChild(svg("text", {x: l - 3, y: top + 10, class: "axis", "text-anchor": "end"}, String(max)));
      root.appendChild(svg("text", {x: l, y: h - 6, class: "axis"}, label(lo)));
      root.appendChild(svg("text", {x: w - 4, y: h - 6, class: "axis", "text-anchor": "end"}, label(hi)));
      fig.appendChild(root);
      box.appendChild(fig);
      if (t.wait.count > 0) quantileMarks(root, t, bounds, lo, l, bw, w, h, b, top);
    }
  }

  // quantileMarks draws the p50, p95 and p99 lines, placed by bucket (log
  // scale), and their labels in the lane above the plot, each pushed right
  // of the one before where they would overlap (then back from the right
  // edge), so they never cover each other.
  function quantileMarks(root, t, bounds, lo, l, bw, w, h, b, top) {
    const pos = (v) => {
      let i = 0;
      while (i < bounds.length && v > bounds[i]) i++;
      const lower = i === 0 ? 0 : bounds[i - 1], upper = i < bounds.length ? bounds[i] : lower * 2;
      const f = i === 0 ? v / upper : Math.log(v / lower) / Math.log(upper / lower);
      return l + (i - lo + Math.min(Math.max(f, 0), 1)) * bw;
    };
    const marks = [["p50", t.wait.p50], ["p95", t.wait.p95], ["p99", t.wait.p99]].map(([q, v]) => {
      const x = Math.min(Math.max(pos(v), l), w - 4);
      root.appendChild(svg("line", {x1: x, x2: x, y1: top, y2: h - b, class: "marker " + q}));
      const text = svg("text", {x: x, y: top - 5, class: "marker-label " + q, "text-anchor": "middle"}, q);
      root.appendChild(text);
      return {x, text, width: text.getComputedTextLength()};
    });
    const gap = 3;
    let right = -Infinity;
    for (const m of marks) {
      m.left = Math.max(m.x - m.width / 2, right + gap, 0);
      right = m.left + m.width;
    }
    let limit = w;
    for (let i = marks.length - 1; i >= 0; i--) {
      const m = marks[i];
      m.left = Math.min(m.left, limit - m.width);
      limit = m.left - gap;
    }
    for (const m of marks) {
      m.text.setAttribute("x", (m.left + m.width / 2).toFixed(1));
    }
  }

  // drawQuota lists every meter of every quota with its limit, what was
  // charged against it on average over the window, its standing now, and
  // the requests it delayed or refused.
  function drawQuota(st) {
    const tb = $("quota").tBodies[0];
    clear(tb);
    $("quota-legend").textContent = "Charged and occupancy are averages " + windowWords(st) +
      "; “now” is each meter's standing at this instant. A joint meter weighs a request as 1 + its tokens × " +
      "token_to_qps_weight. The undeclared tenants each have default_tenant's quota: their limits bind each caller, " +
      "their charged rates are all of them together.";
    for (const t of st.tenants) {
      const q = t.quota;
      const meters = [];
      if (q.qps_limit > 0) meters.push({m: "qps", limit: q.qps_limit, limitText: fmt.rate(q.qps_limit) + " req/s",
        charged: q.charged_per_sec, chargedText: fmt.rate(q.charged_per_sec) + " req/s", occ: q.qps_occupancy, field: "charged_per_sec"});
      if (q.tokens_per_min_limit > 0) meters.push({m: "tokens", limit: q.tokens_per_min_limit, limitText: fmt.int(q.tokens_per_min_limit) + " tokens/min",
        charged: q.charged_tokens_per_min, chargedText: fmt.rate(q.charged_tokens_per_min) + " tokens/min", occ: q.token_occupancy, field: "charged_tokens_per_min"});
      const weightWords = !t.quota_weight_learned ? "" : st.gateway.cost_model.ready ? " (learned)" :
        " (token_to_qps_weight auto: the learned one once the cost model is fitted)";
      if (q.joint_limit > 0) meters.push({m: "joint", limit: q.joint_limit,
        limitText: fmt.rate(q.joint_limit) + " req-eq/s at " + q.token_to_qps_weight.toPrecision(3) + " per token" + weightWords,
        charged: q.charged_joint_per_sec, chargedText: fmt.rate(q.charged_joint_per_sec) + " req-eq/s", occ: q.joint_occupancy, field: "charged_joint_per_sec"});
      // Meters that refused or delayed without being configured now (a
      // reload took them away) still show their hits.
      for (const r of st.quota_reasons) {
        if (q.hits[r] && !meters.some((x) => x.m === r)) meters.push({m: r, limit: 0, limitText: "not configured now"});
      }
      const burst = t.quota_burst && t.quota_burst.allow > 0 ?
        " · bursts " + Math.round(100 * t.quota_burst.allow) + "% above for " + t.quota_burst.window_seconds + " s" : "";
      if (meters.length === 0) {
        tb.appendChild(rowOf([nameCell(t.name), el("td", {class: "muted", colspan: 7}, "no quota")], {"data-tenant": t.name}));
        continue;
      }
      meters.forEach((x, i) => {
        const hit = q.hits[x.m] || {delayed: 0, refused: 0};
        const now = (t.quota_now || []).find((n) => n.meter === x.m);
        const limitCell = el("td", {"data-field": "quota." + x.m + ".limit", "data-value": String(x.limit), class: "limit"},
          (q.per_caller ? "each caller: " : "") + x.limitText + (i === 0 ? burst : ""));
        const cells = [
          i === 0 ? nameCell(t.name) : el("td", {class: "name cont"}, ""),
          el("td", {"data-field": "meter"}, METER_WORDS[x.m] || x.m),
          limitCell,
          x.limit > 0 ? el("td", {"data-field": "quota." + x.field, "data-value": String(x.charged), class: "num"}, x.chargedText) : el("td", {}, "—"),
          occCell(x, q.per_caller),
          nowCell(x.m, now),
          el("td", {"data-field": "quota.hits." + x.m + ".delayed", "data-value": String(hit.delayed), class: "num"}, String(hit.delayed)),
          el("td", {"data-field": "quota.hits." + x.m + ".refused", "data-value": String(hit.refused), class: "num"}, String(hit.refused)),
        ];
        tb.appendChild(rowOf(cells, {"data-tenant": t.name, "data-meter": x.m}));
      });
    }
  }

  function occCell(x, perCaller) {
    if (perCaller) return el("td", {class: "muted", "data-field": "occupancy"}, "— (per caller)");
    if (!(x.limit > 0)) return el("td", {"data-field": "occupancy"}, "—");
    const td = cell("occupancy", x.occ, fmt.pct);
    const bar = el("span", {class: "occ" + (x.occ >= 1 ? " full" : "")});
    const fill = el("span", {class: "occ-fill"});
    fill.style.width = Math.min(x.occ, 1) * 100 + "%";
    bar.appendChild(fill);
    td.appendChild(bar);
    return td;
  }

  // nowCell is a meter's standing now: at rest, or how long its debt
  // takes to pay back; what the x-ratelimit headers would say on hover.
  function nowCell(meter, now) {
    if (!now) return el("td", {class: "muted", "data-field": "now"}, "—");
    const unit = meter === "tokens" ? " tokens" : meter === "joint" ? " request-equivalents" : " requests";
    return el("td", {"data-field": "now", "data-value": String(now.reset_seconds),
      title: "x-ratelimit: limit " + now.limit_per_min + unit + " per minute, remaining " + now.remaining},
    now.reset_seconds > 0 ? "in debt: at rest in " + now.reset_seconds.toFixed(1) + " s" : "at rest");
  }

  // ---------------------------------------------------------- polling

  function drawQueues(st) {
    $("queue-name").textContent = st.queue;
    document.title = "Fair queue “" + st.queue + "” — dashboard";
    const sel = $("queue-select");
    const names = st.queues || [];
    if (sel.options.length !== names.length || names.some((n, i) => sel.options[i].value !== n)) {
      clear(sel);
      for (const n of names) sel.appendChild(el("option", {value: n}, n));
    }
    sel.value = st.queue;
    sel.parentElement.hidden = names.length < 2;
  }

  function markWindow() {
    for (const b of document.querySelectorAll("[data-window]")) {
      b.setAttribute("aria-pressed", b.dataset.window === state.window ? "true" : "false");
    }
  }

  function query() {
    const p = new URLSearchParams({window: state.window});
    if (state.queue) p.set("queue", state.queue);
    return "api/state?" + p.toString();
  }

  // stateURL is the state's address, built from the page's origin and
  // path: a page opened as http://user:password@host/... has a location
  // that carries the credentials, and fetch refuses a URL with them (the
  // browser sends the ones it was given with every request anyway).
  function stateURL() {
    return new URL(query(), location.origin + location.pathname).href;
  }

  async function poll() {
    clearTimeout(state.timer);
    if (state.inflight) {
      state.again = true; // the window or queue changed during a poll
      return;
    }
    state.inflight = true;
    state.again = false;
    const status = $("status");
    try {
      const res = await fetch(stateURL(), {cache: "no-store", headers: {Accept: "application/json"}});
      const body = await res.json();
      if (!res.ok) throw new Error(body.error || res.statusText);
      state.refresh = body.refresh_ms || state.refresh;
      drawQueues(body);
      drawGateway(body);
      drawTenants(body);
      $("state-link").setAttribute("href", query());
      document.body.dataset.window = body.window;
      document.body.dataset.updated = body.now;
      document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
      status.dataset.state = "ok";
      status.textContent = "updated ";
      status.appendChild(timeEl("time", Date.parse(body.now), timeFmt.second));
    } catch (err) {
      status.dataset.state = "error";
      status.textContent = "cannot read state: " + err.message;
    } finally {
      state.inflight = false;
      state.timer = setTimeout(poll, state.again ? 0 : state.refresh);
    }
  }

  function start() {
    for (const b of document.querySelectorAll("[data-window]")) {
      b.addEventListener("click", () => {
        state.window = b.dataset.window;
        markWindow();
        poll();
      });
    }
    $("queue-select").addEventListener("change", (e) => {
      state.queue = e.target.value;
      poll();
    });
    markWindow();
    poll();
  }

  start();
})();
