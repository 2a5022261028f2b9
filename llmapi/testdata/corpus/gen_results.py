import json, random
rng = random.Random(30)
en = [p for p in open('../en.md', encoding='utf-8').read().split('\n\n') if len(p) > 80]
zh = [p for p in open('../zh.txt', encoding='utf-8').read().split('\n\n') if len(p) > 40]
code = open('code_go.txt', encoding='utf-8').read().split('\n')
out = []
def search():
    pool = en if rng.random() < 0.6 else zh
    hits = []
    for i in range(rng.randint(3, 6)):
        p = rng.choice(pool)
        hits.append({"id": f"doc-{rng.randint(1000,99999)}#{rng.randint(1,40)}", "title": p.split('\n')[0][:60].strip('# '),
                     "url": f"https://wiki.example.internal/{rng.choice(['eng','support','ops'])}/{rng.randint(100,9999)}",
                     "score": round(rng.uniform(0.4, 0.98), 4), "updated_at": f"2024-{rng.randint(1,12):02d}-{rng.randint(1,28):02d}",
                     "snippet": p[:rng.randint(200, 700)]})
    return {"query": rng.choice(["wait budget fast fail", "degrade ladder recover", "批量任务 超时", "tenant weight share", "重试 退避"]), "hits": hits}
def order():
    items = [{"sku": f"SKU-{rng.randint(10000,99999)}", "name": rng.choice(["USB-C cable 2m", "Mechanical keyboard (brown switches)", "27\" monitor arm", "降噪耳机", "Laptop stand, aluminium", "移动电源 20000mAh"]),
              "qty": rng.randint(1, 4), "unit_price": round(rng.uniform(5, 400), 2)} for _ in range(rng.randint(1, 6))]
    hist = []
    for s in ["pending", "paid", "shipped", "delivered"][:rng.randint(1, 4)]:
        hist.append({"status": s, "at": f"2024-03-{rng.randint(1,28):02d}T{rng.randint(0,23):02d}:{rng.randint(0,59):02d}:{rng.randint(0,59):02d}Z", "by": rng.choice(["system", "warehouse-7", "payment-gw"])})
    return {"order_id": f"ORD-{rng.randint(20240000, 20249999)}", "customer_id": f"C{rng.randint(100000,999999)}", "status": hist[-1]["status"],
            "currency": rng.choice(["USD", "EUR", "CNY"]), "items": items, "total": round(sum(i["qty"]*i["unit_price"] for i in items), 2),
            "shipping": {"name": rng.choice(["Li Wei", "Anna Schmidt", "王芳", "John Carter"]), "line1": f"{rng.randint(1,999)} {rng.choice(['Main St', 'Elm Road', '文三路', 'Rue de Lyon'])}",
                         "city": rng.choice(["Hangzhou", "Berlin", "杭州", "Austin"]), "postcode": str(rng.randint(10000, 99999)), "country": rng.choice(["CN", "DE", "US"])},
            "payment": {"method": rng.choice(["card", "alipay", "invoice"]), "captured": rng.random() < 0.8, "last4": f"{rng.randint(0,9999):04d}"}, "history": hist}
def sql():
    cols = ["region", "tier", "orders", "revenue", "avg_order", "refund_rate"]
    rows = [[rng.choice(["cn-east", "cn-north", "eu-west", "us-east", "apac"]), rng.choice(["free", "pro", "enterprise"]), rng.randint(10, 90000),
             round(rng.uniform(1000, 9e6), 2), round(rng.uniform(10, 900), 2), round(rng.uniform(0, 0.08), 4)] for _ in range(rng.randint(5, 40))]
    return {"columns": cols, "rows": rows, "row_count": len(rows), "truncated": False, "elapsed_ms": rng.randint(40, 9000)}
def weather():
    return {"location": rng.choice(["Hangzhou, CN", "Berlin, DE", "Austin, US"]), "unit": "celsius", "current": {"temp": round(rng.uniform(-5, 35), 1), "humidity": rng.randint(20, 99), "wind_kph": round(rng.uniform(0, 40), 1), "condition": rng.choice(["clear", "light rain", "overcast", "小雨", "晴"])},
            "hourly": [{"time": f"{h:02d}:00", "temp": round(rng.uniform(-5, 35), 1), "precip_mm": round(rng.uniform(0, 4), 1), "precip_prob": rng.randint(0, 100)} for h in range(rng.randint(6, 24))]}
def readfile():
    start = rng.randint(0, len(code) - 80)
    n = rng.randint(30, 80)
    return {"path": "fairqueue/ahead.go", "start_line": start + 1, "lines": "\n".join(f"{start+i+1:5d}\t{code[start+i]}" for i in range(n))}
def logs():
    lines = []
    for i in range(rng.randint(10, 40)):
        lvl = rng.choice(["INFO", "INFO", "WARN", "ERROR"])
        lines.append(f"2024-03-{rng.randint(1,28):02d}T{rng.randint(0,23):02d}:{rng.randint(0,59):02d}:{rng.randint(0,59):02d}.{rng.randint(0,999):03d}Z {lvl} "
                     + rng.choice([f"http.handlers.fair_queue dispatched tenant=data_batch wait_ms={rng.randint(0,90000)} cost={rng.randint(50,9000)}",
                                   f"upstream 127.0.0.1:{rng.randint(8000,8010)} unhealthy: dial tcp: connection refused (attempt {rng.randint(1,5)})",
                                   f"queue_timeout tenant=cs_bot class=interactive budget=15s queued={rng.randint(0,4000)}",
                                   "panic: runtime error: index out of range [3] with length 3\n\ngoroutine 1187 [running]:\nmain.(*worker).run(0xc000a1c000)\n\t/src/worker.go:211 +0x3a5\ncreated by main.start in goroutine 1\n\t/src/worker.go:88 +0x1f2"]))
    return {"source": "caddy", "lines": lines}
gens = [search]*4 + [order]*3 + [sql]*2 + [weather, readfile, readfile, logs, logs]
for _ in range(40):
    out.append(json.dumps(rng.choice(gens)(), ensure_ascii=False))
with open('results.jsonl', 'w', encoding='utf-8') as f:
    f.write("\n".join(out) + "\n")
