"use strict";
const D = JSON.parse(document.getElementById("qm-data").textContent);
const C = D.cases, N = C.r.length, F = {new: 1, still: 2, fixed: 4, lost: 8, flaky: 16, disagree: 32, diverged: 64};
const RED = new Set(["failed", "error"]), PASS = new Set(["passed", "xpassed"]);
const archs = [...new Set(D.cols.map(c => c[0]))], modes = [...new Set(D.cols.map(c => c[1]))];
const schemes = [...new Set(D.rows.map(r => r[1]).filter(s => s))].sort();
const byCell = new Map();
for (let i = 0; i < N; i++) {
  const k = C.r[i] * D.cols.length + C.k[i];
  if (!byCell.has(k)) byCell.set(k, []);
  byCell.get(k).push(i);
}
const state = {arch: "", mode: "", scheme: "", check: ""};
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}
function fillSelect(id, key, values) {
  const s = document.getElementById(id);
  s.append(el("option", {value: ""}, "all"));
  for (const v of values) s.append(el("option", {value: v}, v));
  s.addEventListener("change", () => { state[key] = s.value; render(); });
}
function visible(i) {
  const col = D.cols[C.k[i]], row = D.rows[C.r[i]];
  return (!state.arch || col[0] === state.arch) && (!state.mode || col[1] === state.mode) &&
    (!state.scheme || row[1] === state.scheme) && (!state.check || D.checks[C.h[i]] === state.check);
}
function status(ids) {
  const o = new Set(ids.map(i => D.outcomes[C.o[i]]));
  if ([...o].some(x => RED.has(x)) || ids.some(i => C.f[i] & F.diverged)) return "fail";
  if (ids.some(i => C.f[i] & F.lost)) return "lost";
  if (o.has("waived")) return "waived";
  return [...o].some(x => PASS.has(x)) ? "pass" : "skip";
}
function cellLabel(ids) {
  const n = {};
  for (const i of ids) { const o = D.outcomes[C.o[i]]; n[o] = (n[o] || 0) + 1; }
  const red = (n.failed || 0) + (n.error || 0), ok = (n.passed || 0) + (n.xpassed || 0);
  const parts = [];
  if (red) parts.push("\u2717" + red);
  if (n.missing) parts.push("\u2205" + n.missing);
  if (n.waived) parts.push("W" + n.waived);
  if (n.skipped) parts.push("s" + n.skipped);
  if (ok) parts.push("\u2713" + ok);
  if (ids.some(i => C.f[i] & F.disagree)) parts.push("\u2260");
  return parts.join(" ");
}
function render() {
  const cols = D.cols.map((c, k) => [c, k]).filter(([c]) => (!state.arch || c[0] === state.arch) &&
    (!state.mode || c[1] === state.mode));
  const rows = D.rows.map((r, i) => [r, i]).filter(([r]) => !state.scheme || r[1] === state.scheme);
  const t = document.getElementById("grid");
  t.replaceChildren();
  const h1 = el("tr", {}, el("th", {rowspan: 2}, "checkpoint"), el("th", {rowspan: 2}, "scheme"));
  const h2 = el("tr");
  let last = null, span = null;
  for (const [c] of cols) {
    if (c[0] !== last) { span = el("th", {colspan: 1, class: "arch"}, c[0]); h1.append(span); last = c[0]; }
    else span.setAttribute("colspan", +span.getAttribute("colspan") + 1);
    h2.append(el("th", {class: "mode"}, c[1]));
  }
  t.append(el("thead", {}, h1, h2));
  const body = el("tbody");
  for (const [r, ri] of rows) {
    const tr = el("tr", {"data-row": r[0]}, el("th", {class: "row"}, r[0]),
      el("th", {class: "row muted"}, r[1]));
    for (const [c, k] of cols) {
      const ids = (byCell.get(ri * D.cols.length + k) || []).filter(visible);
      if (!ids.length) {
        tr.append(el("td", {class: "cell empty", "data-arch": c[0], "data-mode": c[1]}));
        continue;
      }
      const st = status(ids), isNew = ids.some(i => C.f[i] & F.new);
      tr.append(el("td", {class: "cell st-" + st + (isNew ? " new" : ""), "data-arch": c[0],
        "data-mode": c[1], "data-status": st, title: r[0] + " @ " + c[0] + " / " + c[1],
        onclick: ev => showCell(ri, k, ev.currentTarget)}, cellLabel(ids) + (isNew ? " NEW" : "")));
    }
    body.append(tr);
  }
  t.append(body);
  renderLists();
}
function caseBlock(i) {
  const o = D.outcomes[C.o[i]], d = D.details[i], f = C.f[i];
  const tags = [["new", "new failure"], ["still", "still failing"], ["fixed", "fixed"],
    ["lost", "coverage lost"], ["flaky", "flaky"], ["disagree", "differs across archs"],
    ["diverged", "outside another arch's top-k"]]
    .filter(([k]) => f & F[k]).map(([, t]) => t);
  const head = el("div", {}, el("span", {class: "badge o-" + o}, o), el("b", {}, D.checks[C.h[i]]),
    ...tags.map(t => el("span", {class: "tag"}, t)));
  const box = el("div", {class: "case", "data-case": i}, head);
  if (!d) return box;
  box.append(el("div", {class: "muted"}, d.id));
  if (d.msg) box.append(el("pre", {class: "msg"}, d.msg));
  const now = "now vLLM " + (d.vllm || "?");
  if (d.bisect) box.append(el("div", {class: "bisect"}, d.bisect.last_passed_night ? "last passed " +
    d.bisect.last_passed_night + " (vLLM " + (d.bisect.last_passed_vllm || "?") + ") \u2192 " + now :
    "no pass in the nights kept; " + now));
  if (d.offer_bundle) box.append(el("div", {class: "offer"}, el("a", {href: d.offer_bundle + "/"}, "repro bundle"),
    " (repro.py runs without quantmatrix; ISSUE.md is the issue body)"));
  for (const [k, label] of [["offer_rerun", "rerun this case locally"], ["offer_bisect", "bisect"]])
    if (d[k]) box.append(el("div", {class: "offer"}, label + ": ", el("code", {}, d[k])));
  if (d.waiver) {
    const w = el("div", {class: "waiver"}, "waiver: " + d.waiver.reason + " (expires " +
      d.waiver.expires + ") ");
    const link = d.waiver.link;
    w.append(/^https?:\/\//.test(link) ? el("a", {href: link}, link) : link);
    box.append(w);
  }
  if (d.attempts.length) box.append(el("div", {}, "attempts: " + d.attempts.join(" \u2192 ")));
  if (d.history) box.append(el("div", {class: "muted"}, "history: " +
    d.history.map(h => h[0] + " " + h[1] + (h[2] ? " (vLLM " + h[2] + ")" : "")).join(", ")));
  const where = [d.device, d.runner].filter(x => x).join(" on ");
  const vllm = d.vllm ? " \u00b7 vLLM " + d.vllm : "";
  if (where || d.vllm) box.append(el("div", {class: "muted"}, where + vllm));
  if (d.log) box.append(el("details", {open: ""}, el("summary", {}, "log tail"),
    el("pre", {class: "log"}, d.log)));
  return box;
}
function showCases(title, ids) {
  const p = document.getElementById("detail");
  const order = i => RED.has(D.outcomes[C.o[i]]) ? 0 : (C.f[i] & F.lost ? 1 : (D.details[i] ? 2 : 3));
  p.replaceChildren(el("h2", {}, title), ...[...ids].sort((a, b) => order(a) - order(b)).map(caseBlock));
  p.hidden = false;
  p.scrollIntoView({block: "nearest"});
}
function showCell(ri, k, td) {
  document.querySelectorAll(".sel").forEach(e => e.classList.remove("sel"));
  td.classList.add("sel");
  const c = D.cols[k];
  showCases(D.rows[ri][0] + " @ " + c[0] + " / " + c[1], byCell.get(ri * D.cols.length + k).filter(visible));
}
function renderLists() {
  const box = document.getElementById("lists");
  box.replaceChildren();
  for (const [name, all] of Object.entries(D.lists)) {
    const ids = all.filter(visible);
    if (!ids.length) continue;
    const items = ids.slice(0, 500).map(i => el("li", {},
      el("a", {onclick: () => showCases(D.details[i].id, [i])}, D.details[i].id),
      D.details[i].msg ? " \u2014 " + D.details[i].msg.split("\n")[0].slice(0, 200) : ""));
    box.append(el("h2", {}, name + " (" + ids.length + ")"), el("ul", {"data-list": name}, ...items));
    if (ids.length > 500) box.append(el("p", {class: "muted"}, (ids.length - 500) + " more in summary.json"));
  }
  const dis = D.disagreements.filter(x => x.cases.some(visible));
  if (dis.length) box.append(el("h2", {}, "Cross-arch disagreements (" + dis.length + ")"),
    el("ul", {"data-list": "disagreements"}, ...dis.map(x =>
      el("li", {}, x.red ? "\u274c " : "\u2248 ",
        el("a", {onclick: () => showCases("cross-arch disagreement", x.cases)}, x.text)))));
  if (D.bad.length) box.append(el("h2", {}, "Bad input files, skipped (" + D.bad.length + ")"),
    el("ul", {"data-list": "bad"}, ...D.bad.map(b => el("li", {}, el("code", {}, b.path), ": " +
      b.problem))));
  const heads = ["file", "runner", "arch", "device", "vLLM", "torch", "cases"];
  const runs = el("table", {id: "runs"}, el("tr", {}, ...heads.map(h => el("th", {}, h))));
  for (const r of D.runs.slice(0, 200)) runs.append(el("tr", {}, ...[r.path, r.runner, r.arch, r.device_name,
    r.vllm_version, r.torch_version, String(r.cases)].map(v => el("td", {}, v))));
  box.append(el("h2", {}, "Runs (" + D.runs.length + ")"), runs);
}
document.getElementById("title").textContent = "quantmatrix nightly \u2014 " + D.night;
document.getElementById("sub").textContent =
  (D.previous ? "vs " + D.previous : "no previous night to diff against") +
  " \u00b7 " + D.runs.length + " JUnit files \u00b7 " + N + " cases \u00b7 " +
  Object.entries(D.totals).filter(([, n]) => n).map(([o, n]) => n + " " + o).join(" \u00b7 ");
const banner = document.getElementById("banner");
banner.className = D.exit ? "bad" : "good";
const lostArchs = D.archs_lost.length ? "; no results at all from " + D.archs_lost.join(", ") : "";
const diverged = D.disagreements.reduce((n, x) => n + x.red, 0);
banner.textContent = D.exit ? D.lists["New failures"].length + " new failures, " +
  D.lists["Still failing"].length + " still failing; coverage lost: " + D.lists["Coverage lost"].length +
  lostArchs + (diverged ? "; cross-arch outside the top-k: " + diverged : "") :
  "nothing is failing and nothing stopped being tested";
const broken = document.getElementById("vllm-broken");
for (const line of D.vllm_broken) broken.append(el("p", {class: "bad"}, line));
fillSelect("f-arch", "arch", archs);
fillSelect("f-mode", "mode", modes);
fillSelect("f-scheme", "scheme", schemes);
fillSelect("f-check", "check", D.checks);
render();
