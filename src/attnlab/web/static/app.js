// attnlab explorer: hand-written, no libraries, no network access beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);

const state = {
  info: null,      // /api/info: family, n_layer, n_head, limits
  result: null,    // /api/attention: tokens, layer_index, layers[l][h][q][k], next_token
  layer: 0,        // index into result.layers
  head: 0,
  hoverRow: null,
  tab: "text",
  convPos: null,   // the query position picked in the convolution tab
  text: null,      // the text of the last run (bert: clicking a token re-runs it with that token masked)
  mask: [],        // bert: token positions ([CLS] = 0) masked by a click
  image: null,     // /api/image (vit): pixels, grid, layers[l][h] (gh, gw), rollout, top5
  imageLayer: -1,  // -1: the rollout; else an index into image.layers
  imageHead: 0,
  imageRuns: 0,
  status: {},      // the status line of each tab, shown when its tab is
};

// ---------- shared helpers ----------

// A perceptual sequential colour map (viridis, 9 stops), t in [0, 1].
const VIRIDIS = [
  [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
];
function colour(t) {
  t = Math.min(1, Math.max(0, t));
  const x = t * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const f = x - i;
  const c = VIRIDIS[i].map((a, j) => Math.round(a + f * (VIRIDIS[i + 1][j] - a)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// Whitespace made visible in labels.
function showToken(t) {
  return t.replace(/\n/g, "⏎").replace(/\t/g, "⇥").replace(/ /g, "␣") || "∅";
}

// The status line belongs to the tab that set it: switching tabs shows that tab's own line.
function setStatus(message, isError = false, tab = state.tab) {
  state.status[tab] = { message, isError };
  if (tab !== state.tab) return;
  const el = $("status");
  el.textContent = message;
  el.classList.toggle("error", isError);
  el.dataset.tab = tab;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    throw new Error((data && data.error) || `HTTP ${response.status}`);
  }
  return data;
}

function fillSelect(select, n, prefix, labels) {
  select.innerHTML = "";
  for (let i = 0; i < n; i++) {
    const option = document.createElement("option");
    option.value = String(i);
    option.textContent = `${prefix} ${labels ? labels[i] : i}`;
    select.appendChild(option);
  }
}

function currentMatrix() {
  if (!state.result || !state.result.layers.length) return null;
  return state.result.layers[state.layer][state.head];
}

// A short fingerprint of a matrix (sum of p * (position + 1)); tests compare it between heads.
function signature(matrix) {
  let s = 0;
  matrix.forEach((row, i) => row.forEach((p, j) => { s += p * (i * row.length + j + 1); }));
  return s.toFixed(6);
}

// ---------- text tab: heatmap, tokens, head grid, next-token bars ----------

const LABEL_FONT = '12px ui-monospace, "DejaVu Sans Mono", monospace';
const TITLE_H = 18;   // the title line above the column labels
const LEGEND_W = 56;  // the colour bar and its ticks, right of the matrix

// Room for the labels: the widest row label on the left; the column labels stand vertically on top,
// so the widest of them sets the top margin. Labels never overlap or get clipped (tested).
function heatmapLayout(ctx, labels, width) {
  ctx.font = LABEL_FONT;
  const widest = labels.length ? Math.max(...labels.map((l) => ctx.measureText(l).width)) : 0;
  const labelRoom = Math.ceil(widest) + 8;
  const T = Math.max(labels.length, 1);
  const cell = Math.max(1, Math.floor((width - labelRoom - LEGEND_W) / T));
  const showLabels = cell >= 12;  // a 12 px font needs 12 px per row and per (vertical) column
  const left = showLabels ? labelRoom : 4;
  return { cell: showLabels ? cell : Math.max(1, Math.floor((width - left - LEGEND_W) / T)), left,
           top: TITLE_H + (showLabels ? labelRoom : 4), showLabels, widest };
}

// A vertical colour bar: the probability each colour stands for, 0 at the bottom, 1 at the top.
function drawLegend(ctx, x, y, height) {
  const steps = 64;
  for (let k = 0; k < steps; k++) {
    ctx.fillStyle = colour(1 - k / (steps - 1));
    ctx.fillRect(x, y + (k * height) / steps, 12, Math.ceil(height / steps));
  }
  ctx.strokeStyle = "#98a2b3";
  ctx.strokeRect(x, y, 12, height);
  ctx.fillStyle = "#475467";
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  for (const v of [0, 0.25, 0.5, 0.75, 1]) ctx.fillText(v.toFixed(2), x + 16, y + (1 - v) * height);
  ctx.textBaseline = "bottom";
  ctx.fillText("p", x + 2, y - 3);
}

function drawHeatmap() {
  const canvas = $("heatmap");
  const matrix = currentMatrix();
  const T = matrix ? matrix.length : 0;
  const ctx = canvas.getContext("2d");
  const labels = matrix ? state.result.tokens.map(showToken) : [];
  const L = heatmapLayout(ctx, labels, canvas.width);
  const height = matrix ? L.top + T * L.cell + 6 : canvas.width;
  if (canvas.height !== height) canvas.height = height; // as tall as the matrix needs
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  if (!matrix) return;
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < T; j++) {
      ctx.fillStyle = colour(matrix[i][j]);
      ctx.fillRect(L.left + j * L.cell, L.top + i * L.cell, L.cell, L.cell);
    }
  }
  if (L.showLabels) {
    ctx.fillStyle = "#1d2330";
    ctx.font = LABEL_FONT;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i < T; i++) ctx.fillText(labels[i], L.left - 4, L.top + (i + 0.5) * L.cell);
    ctx.textAlign = "left";
    for (let j = 0; j < T; j++) {  // column labels upright, reading bottom to top
      ctx.save();
      ctx.translate(L.left + (j + 0.5) * L.cell, L.top - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(labels[j], 0, 0);
      ctx.restore();
    }
  }
  drawLegend(ctx, L.left + T * L.cell + 10, L.top, T * L.cell);
  ctx.fillStyle = "#667085";
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  ctx.fillText(`layer ${state.result.layer_index[state.layer]}, head ${state.head}  (rows: queries, columns: keys)`, 2, 2);
  if (state.hoverRow !== null && state.hoverRow < T) {
    ctx.strokeStyle = "#e8590c";
    ctx.lineWidth = 2;
    ctx.strokeRect(L.left - 1, L.top + state.hoverRow * L.cell - 1, T * L.cell + 2, L.cell + 2);
  }
  state.heatmapLayout = L;
  Object.assign(canvas.dataset, {
    layer: String(state.result.layer_index[state.layer]), head: String(state.head), tokens: String(T),
    signature: signature(matrix), labelRoom: String(L.showLabels ? L.left : 0), widestLabel: L.widest.toFixed(1),
    labels: L.showLabels ? "1" : "0", cell: String(L.cell), legend: "0-1",
  });
}

function heatmapRowAt(event) {
  const canvas = $("heatmap");
  if (!state.result) return null;
  const rect = canvas.getBoundingClientRect();
  const y = (event.clientY - rect.top) * (canvas.height / rect.height);
  const T = state.result.tokens.length;
  const L = state.heatmapLayout;
  if (!L) return null;
  const row = Math.floor((y - L.top) / L.cell);
  return row >= 0 && row < T ? row : null;
}

function setHoverRow(row) {
  state.hoverRow = row;
  document.querySelectorAll("#tokens .token").forEach((el, i) => el.classList.toggle("active", i === row));
  const readout = $("row-readout");
  const matrix = currentMatrix();
  if (row === null || !matrix) {
    readout.textContent = "";
  } else {
    const tokens = state.result.tokens;
    const top = matrix[row].map((p, j) => [p, j]).sort((a, b) => b[0] - a[0]).slice(0, 5);
    readout.textContent = `"${showToken(tokens[row])}" (position ${row}) attends to: ` +
      top.map(([p, j]) => `"${showToken(tokens[j])}"@${j} ${p.toFixed(3)}`).join(", ");
  }
  drawHeatmap();
}

function isBert() {
  return state.info && state.info.family === "bert";
}

function renderTokens() {
  const box = $("tokens");
  box.innerHTML = "";
  const T = state.result.tokens.length;
  const masked = new Set((state.result.masked || []).map((m) => m.position));
  state.result.tokens.forEach((t, i) => {
    const chip = document.createElement("span");
    chip.className = "token" + (masked.has(i) ? " masked" : "");
    chip.textContent = showToken(t);
    chip.title = `position ${i}`;
    chip.dataset.position = String(i);
    if (isBert() && i > 0 && i < T - 1) { // [CLS] and [SEP] cannot be masked
      chip.classList.add("clickable");
      chip.title += state.mask.includes(i) ? ": click to unmask" : ": click to mask and see the guesses";
      chip.addEventListener("click", () => toggleMask(i));
    }
    chip.addEventListener("mouseenter", () => setHoverRow(i));
    chip.addEventListener("mouseleave", () => setHoverRow(null));
    box.appendChild(chip);
  });
}

// bert: mask (or unmask) the token at position i of the last text, and run the model again
function toggleMask(i) {
  state.mask = state.mask.includes(i) ? state.mask.filter((j) => j !== i) : [...state.mask, i].sort((a, b) => a - b);
  runModel(true);
}

function drawThumbnail(canvas, matrix) {
  const ctx = canvas.getContext("2d");
  const T = matrix.length;
  const cell = canvas.width / T;
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < T; j++) {
      ctx.fillStyle = colour(matrix[i][j]);
      ctx.fillRect(j * cell, i * cell, Math.ceil(cell), Math.ceil(cell));
    }
  }
}

// Every layer and head at once: L rows of H thumbnails; a click selects that layer and head.
function renderOverview() {
  const box = $("layer-overview");
  box.innerHTML = "";
  const heads = state.result.layers.length ? state.result.layers[0].length : 0;
  box.style.gridTemplateColumns = `auto repeat(${heads}, 44px)`;
  state.result.layers.forEach((layer, l) => {
    const name = document.createElement("span");
    name.className = "overview-layer";
    name.textContent = `layer ${state.result.layer_index[l]}`;
    box.appendChild(name);
    layer.forEach((matrix, h) => {
      const canvas = document.createElement("canvas");
      canvas.width = 44;
      canvas.height = 44;
      canvas.className = "overview-thumb" + (l === state.layer && h === state.head ? " selected" : "");
      canvas.dataset.layer = String(l);
      canvas.dataset.head = String(h);
      canvas.title = `layer ${state.result.layer_index[l]}, head ${h}`;
      drawThumbnail(canvas, matrix);
      canvas.addEventListener("click", () => { selectLayer(l); selectHead(h); });
      box.appendChild(canvas);
    });
  });
  box.dataset.layers = String(state.result.layers.length);
  box.dataset.heads = String(heads);
}

function markOverview() {
  document.querySelectorAll("#layer-overview .overview-thumb").forEach((c) => c.classList.toggle(
    "selected", Number(c.dataset.layer) === state.layer && Number(c.dataset.head) === state.head));
}

function renderHeadGrid() {
  const grid = $("head-grid");
  grid.innerHTML = "";
  state.result.layers[state.layer].forEach((matrix, h) => {
    const item = document.createElement("div");
    item.className = "thumb" + (h === state.head ? " selected" : "");
    item.dataset.head = String(h);
    const canvas = document.createElement("canvas");
    canvas.width = 88;
    canvas.height = 88;
    drawThumbnail(canvas, matrix);
    const label = document.createElement("span");
    label.textContent = `head ${h}`;
    item.append(canvas, label);
    item.addEventListener("click", () => selectHead(h));
    grid.appendChild(item);
  });
}

// Bars of a top-k list [{token, p}], most likely first, into an <ol>. A bar's length is the
// probability itself (the full width is p = 1), so 0.0014 is a sliver whatever the top-1 is.
const BAR_WIDTH = 180;
function fillBars(list, items) {
  list.innerHTML = "";
  items.forEach(({ token, p }) => {
    const li = document.createElement("li");
    li.innerHTML = '<div class="bar-row"><span class="bar-label"></span><span class="bar"></span>' +
      '<span class="bar-p"></span></div>';
    li.querySelector(".bar-label").textContent = showToken(token);
    li.querySelector(".bar").style.width = `${Math.max(1, Math.round(BAR_WIDTH * p))}px`;
    li.dataset.p = String(p);
    li.querySelector(".bar-p").textContent = p.toFixed(4);
    list.appendChild(li);
  });
}

function renderNextToken() {
  if (!isBert()) {
    fillBars($("next-token"), state.result.next_token);
    return;
  }
  const box = $("mask-guesses");
  box.innerHTML = "";
  box.className = "";
  if (state.info.warning) {  // e.g. an import whose MLM head is a fresh init: say so beside its guesses
    const w = document.createElement("p");
    w.id = "mask-warning";
    w.className = "hint error";
    w.textContent = `warning: ${state.info.warning}`;
    box.appendChild(w);
  }
  if (!state.result.masked.length) {
    const none = document.createElement("p");
    none.className = "hint";
    none.textContent = "no [MASK] in this text: type [MASK] or click a token";
    box.appendChild(none);
    return;
  }
  state.result.masked.forEach(({ position, guesses }) => {
    const head = document.createElement("div");
    head.className = "mask-position";
    head.textContent = `[MASK] at position ${position}`;
    const list = document.createElement("ol");
    list.dataset.position = String(position);
    fillBars(list, guesses);
    box.append(head, list);
  });
}

function selectLayer(l) {
  state.layer = l;
  $("layer").value = String(l);
  $("conv-layer").value = String(l);
  renderHeadGrid();
  markOverview();
  drawHeatmap();
  setHoverRow(state.hoverRow);
  drawConv();
}

function selectHead(h) {
  state.head = h;
  $("head").value = String(h);
  $("conv-head").value = String(h);
  document.querySelectorAll("#head-grid .thumb").forEach((el, i) => el.classList.toggle("selected", i === h));
  markOverview();
  drawHeatmap();
  setHoverRow(state.hoverRow);
  drawConv();
}

async function runModel(keepMask = false) {
  const text = keepMask && state.text !== null ? state.text : $("text-input").value;
  if (!keepMask || text !== state.text) state.mask = [];
  setStatus("running the model…", false, "text");
  $("run").disabled = true;
  try {
    const result = await api("/api/attention", isBert() ? { text, mask: state.mask } : { text });
    state.text = text;
    state.result = result;
    const heads = result.layers.length ? result.layers[0].length : 0;
    const labels = result.layer_index;
    for (const id of ["layer", "conv-layer"]) fillSelect($(id), result.layers.length, "layer", labels);
    for (const id of ["head", "conv-head"]) fillSelect($(id), heads, "head");
    state.layer = Math.min(state.layer, result.layers.length - 1);
    state.head = Math.min(state.head, heads - 1);
    state.hoverRow = null;
    state.convPos = result.tokens.length - 1;
    renderTokens();
    renderNextToken();
    renderOverview();
    selectLayer(state.layer);
    selectHead(state.head);
    setStatus(`${result.tokens.length} tokens, ${result.layers.length} attention layers × ${heads} heads`, false, "text");
    document.body.dataset.ready = "1";
    document.body.dataset.runs = String(parseInt(document.body.dataset.runs || "0", 10) + 1);
  } catch (e) {
    setStatus(e.message, true, "text");
  } finally {
    $("run").disabled = false;
  }
}

// ---------- toy tab: the lecture's 4-token example, recomputed on every edit ----------

const TOY_TOKENS = ["A", "B", "C", "D"];
const TOY_DEFAULT = {
  Q: [[1, 0], [0, 1], [1, 1], [1, -1]],
  K: [[1, 0], [0, 1], [1, 1], [1, -1]],
  V: [[10, 0], [0, 10], [5, 5], [3, -3]],
};
let toyLast = null;

function buildToyInputs() {
  for (const name of ["Q", "K", "V"]) {
    const table = $(`toy-${name}`);
    table.innerHTML = "<tr><th></th><th>d0</th><th>d1</th></tr>";
    TOY_TOKENS.forEach((tok, i) => {
      const tr = document.createElement("tr");
      tr.innerHTML = `<th>${tok}</th>`;
      for (let d = 0; d < 2; d++) {
        const td = document.createElement("td");
        const input = document.createElement("input");
        input.type = "number";
        input.step = "0.5";
        input.id = `toy-${name}-${i}-${d}`;
        input.value = String(TOY_DEFAULT[name][i][d]);
        input.addEventListener("input", computeToy);
        td.appendChild(input);
        tr.appendChild(td);
      }
      table.appendChild(tr);
    });
  }
}

function readToy(name) {
  return TOY_TOKENS.map((_, i) => [0, 1].map((d) => {
    const v = parseFloat($(`toy-${name}-${i}-${d}`).value);
    return Number.isFinite(v) ? v : 0;
  }));
}

// S = scale * Q K^T (masked entries -inf), P = softmax(S) per row (max subtracted), Z = P V.
function attentionToy(Q, K, V, scaled, causal) {
  const dk = Q[0].length;
  const scale = scaled ? 1 / Math.sqrt(dk) : 1;
  const scores = Q.map((q, i) => K.map((k, j) => (causal && j > i ? -Infinity
    : scale * q.reduce((s, qd, d) => s + qd * k[d], 0))));
  const weights = scores.map((row) => {
    const top = Math.max(...row);
    const e = row.map((s) => (s === -Infinity ? 0 : Math.exp(s - top)));
    const total = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / total);
  });
  const outputs = weights.map((w) => V[0].map((_, d) => w.reduce((s, wj, j) => s + wj * V[j][d], 0)));
  return { scale, scores, weights, outputs };
}

function fillMatrixTable(table, rows, colLabels, digits, shade) {
  table.innerHTML = "<tr><th></th>" + colLabels.map((c) => `<th>${c}</th>`).join("") + "</tr>";
  rows.forEach((row, i) => {
    const tr = document.createElement("tr");
    tr.innerHTML = `<th>${TOY_TOKENS[i]}</th>`;
    row.forEach((v) => {
      const td = document.createElement("td");
      if (v === -Infinity) {
        td.textContent = "−∞";
        td.className = "masked";
      } else {
        td.textContent = v.toFixed(digits);
        td.dataset.value = String(v);
        if (shade) {
          td.style.background = colour(v);
          td.style.color = v > 0.55 ? "#1d2330" : "#fff";
        }
      }
      tr.appendChild(td);
    });
    table.appendChild(tr);
  });
}

function drawToyCanvas(result, scaled, causal) {
  const canvas = $("toy-canvas");
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const cell = 58;
  const left = 40;
  const top = 50;
  ctx.fillStyle = "#1d2330";
  ctx.font = "13px system-ui, sans-serif";
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  ctx.fillText(`P = softmax(${scaled ? "QKᵀ/√2" : "QKᵀ"})${causal ? ", causal" : ""}`, 8, 8);
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  TOY_TOKENS.forEach((t, j) => ctx.fillText(t, left + (j + 0.5) * cell, top - 12));
  TOY_TOKENS.forEach((t, i) => ctx.fillText(t, left - 14, top + (i + 0.5) * cell));
  result.weights.forEach((row, i) => row.forEach((p, j) => {
    ctx.fillStyle = colour(p);
    ctx.fillRect(left + j * cell, top + i * cell, cell - 2, cell - 2);
    ctx.fillStyle = p > 0.55 ? "#1d2330" : "#fff";
    ctx.fillText(p.toFixed(3), left + (j + 0.5) * cell - 1, top + (i + 0.5) * cell - 1);
  }));
  ctx.fillStyle = "#1d2330";
  ctx.textAlign = "left";
  const zx = left + 4 * cell + 30;
  ctx.fillText("Z = P V", zx, top - 12);
  result.outputs.forEach((z, i) => {
    ctx.fillText(`z${TOY_TOKENS[i]} = (${z.map((v) => v.toFixed(3)).join(", ")})`, zx, top + (i + 0.5) * cell);
  });
}

function computeToy() {
  const Q = readToy("Q");
  const K = readToy("K");
  const V = readToy("V");
  const scaled = $("toy-scale").checked;
  const causal = $("toy-causal").checked;
  const result = attentionToy(Q, K, V, scaled, causal);
  fillMatrixTable($("toy-scores"), result.scores, TOY_TOKENS, 3, false);
  fillMatrixTable($("toy-weights"), result.weights, TOY_TOKENS, 4, true);
  fillMatrixTable($("toy-outputs"), result.outputs, ["z0", "z1"], 4, false);
  drawToyCanvas(result, scaled, causal);
  toyLast = { tokens: TOY_TOKENS, Q, K, V, scaled, causal, ...result };
}

function resetToy() {
  for (const name of ["Q", "K", "V"]) {
    TOY_TOKENS.forEach((_, i) => [0, 1].forEach((d) => {
      $(`toy-${name}-${i}-${d}`).value = String(TOY_DEFAULT[name][i][d]);
    }));
  }
  $("toy-scale").checked = false;
  $("toy-causal").checked = false;
  computeToy();
}

// ---------- convolution vs attention ----------

// Inputs a width-k convolution stacked L times can reach from position i (sequence of length T):
// each layer widens the window by k-1, to the left only (causal) or (k-1)/2 on each side.
function convReach(i, T, k, L, causal) {
  const lo = causal ? i - L * (k - 1) : i - L * ((k - 1) / 2);
  const hi = causal ? i : i + L * ((k - 1) / 2);
  return [Math.max(0, lo), Math.min(T - 1, hi)];
}

const CONV = { left: 120, top: 40, cell: 24, perLine: 31, gap: 34 };
let convLast = null;

function convCellXY(j, band) {
  const line = Math.floor(j / CONV.perLine);
  const col = j % CONV.perLine;
  const lines = Math.ceil(state.result.tokens.length / CONV.perLine);
  const bandTop = CONV.top + band * (lines * CONV.gap + 30);
  return [CONV.left + col * CONV.cell, bandTop + line * CONV.gap];
}

function drawConv() {
  const canvas = $("conv-canvas");
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const summary = $("conv-summary");
  if (!state.result || !state.result.layers.length) {
    ctx.fillStyle = "#667085";
    ctx.font = "14px system-ui, sans-serif";
    ctx.fillText("Run the model on a text (Text tab) to compare with its attention.", 20, 40);
    summary.textContent = "";
    convLast = null;
    return;
  }
  const tokens = state.result.tokens;
  const T = tokens.length;
  const k = parseInt($("conv-k").value, 10);
  const L = parseInt($("conv-depth").value, 10);
  const causal = $("conv-causal").checked;
  const i = state.convPos === null ? T - 1 : Math.min(state.convPos, T - 1);
  const [lo, hi] = convReach(i, T, k, L, causal);
  const row = state.result.layers[state.layer][state.head][i];
  const rowMax = Math.max(...row, 1e-9);
  const lines = Math.ceil(T / CONV.perLine);
  canvas.height = CONV.top + 2 * (lines * CONV.gap + 30) + 10;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.font = "12px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  const bands = [`conv k=${k}, ×${L}`, `attention L${state.result.layer_index[state.layer]} H${state.head}`];
  ctx.fillStyle = "#667085";
  ctx.textAlign = "left";
  ctx.fillText(`blue: what the convolution reaches from position ${i}; below: the attention weights of ` +
    `position ${i} (colour = weight / row max ${rowMax.toFixed(3)})`, 4, 14);
  bands.forEach((label, band) => {
    const [, y] = convCellXY(0, band);
    ctx.fillStyle = "#1d2330";
    ctx.textAlign = "left";
    ctx.fillText(label, 4, y + CONV.cell / 2);
    for (let j = 0; j < T; j++) {
      const [x, yj] = convCellXY(j, band);
      if (band === 0) {
        ctx.fillStyle = j >= lo && j <= hi ? "#2b59c3" : "#eef1f6";
      } else {
        ctx.fillStyle = colour(row[j] / rowMax);
      }
      ctx.fillRect(x, yj, CONV.cell - 2, CONV.cell - 2);
      if (j === i) {
        ctx.strokeStyle = "#e8590c";
        ctx.lineWidth = 3;
        ctx.strokeRect(x - 1, yj - 1, CONV.cell, CONV.cell);
      }
      ctx.fillStyle = band === 0 && j >= lo && j <= hi ? "#fff" : "#1d2330";
      if (band === 1) ctx.fillStyle = row[j] / rowMax > 0.55 ? "#1d2330" : "#fff";
      ctx.textAlign = "center";
      ctx.font = "12px ui-monospace, 'DejaVu Sans Mono', monospace";
      ctx.fillText(showToken(tokens[j]).slice(0, 2), x + CONV.cell / 2 - 1, yj + CONV.cell / 2 - 1);
      ctx.font = "12px system-ui, sans-serif";
    }
  });
  const reach = hi - lo + 1;
  const outside = row.reduce((s, p, j) => s + (j < lo || j > hi ? p : 0), 0);
  const visible = row.reduce((s, p) => s + (p > 0 ? 1 : 0), 0);
  summary.textContent = `position ${i} ("${showToken(tokens[i])}"): the convolution reaches ${reach} of ${T} inputs ` +
    `(positions ${lo}–${hi}); the attention row is non-zero on ${visible} inputs and puts ` +
    `${(100 * outside).toFixed(1)}% of its weight outside the convolution's reach.`;
  canvas.dataset.position = String(i);
  canvas.dataset.reach = `${lo}-${hi}`;
  convLast = {
    tokens, position: i, kernel_width: k, layers: L, causal, conv_reach: [lo, hi],
    attention_layer: state.result.layer_index[state.layer], attention_head: state.head, attention_row: row,
    attention_weight_outside_reach: outside,
  };
}

function convClick(event) {
  if (!state.result) return;
  const canvas = $("conv-canvas");
  const rect = canvas.getBoundingClientRect();
  const x = (event.clientX - rect.left) * (canvas.width / rect.width);
  const y = (event.clientY - rect.top) * (canvas.height / rect.height);
  for (let band = 0; band < 2; band++) {
    for (let j = 0; j < state.result.tokens.length; j++) {
      const [cx, cy] = convCellXY(j, band);
      if (x >= cx && x < cx + CONV.cell && y >= cy && y < cy + CONV.cell) {
        state.convPos = j;
        drawConv();
        return;
      }
    }
  }
}

// ---------- tabs and downloads ----------

// ---------- image tab (vit): upload, top 5 classes, [CLS] -> patch attention over the image ----------

function currentImageMap() {
  const r = state.image;
  if (!r) return null;
  return state.imageLayer < 0 ? r.rollout : r.layers[state.imageLayer][state.imageHead];
}

function drawImage() {
  const canvas = $("image-canvas");
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const r = state.image;
  const map = currentImageMap();
  if (!r || !map) {
    ctx.fillStyle = "#667085";
    ctx.font = "14px system-ui, sans-serif";
    ctx.fillText("Choose an image and run the model.", 20, 40);
    return;
  }
  // left: the image the model saw; right: the same image under the map
  const H = r.pixels.length;
  const W = r.pixels[0].length;
  const GAP = 12;
  const px = Math.max(1, Math.floor(Math.min((canvas.width - GAP) / (2 * W), (canvas.height - 20) / H)));
  const right = W * px + GAP;
  for (const x0 of [0, right]) {
    for (let i = 0; i < H; i++) {
      for (let j = 0; j < W; j++) {
        const v = r.pixels[i][j];
        ctx.fillStyle = Array.isArray(v) ? `rgb(${v[0]},${v[1]},${v[2]})` : `rgb(${v},${v},${v})`;
        ctx.fillRect(x0 + j * px, 20 + i * px, px, px);
      }
    }
  }
  // the map lives on the patch grid (gh, gw): one translucent block per patch, scaled to its maximum
  const [gh, gw] = r.grid;
  const top = Math.max(...map.flat(), 1e-12);
  const ph = (H * px) / gh;
  const pw = (W * px) / gw;
  ctx.globalAlpha = 0.6;
  for (let a = 0; a < gh; a++) {
    for (let b = 0; b < gw; b++) {
      ctx.fillStyle = colour(map[a][b] / top);
      ctx.fillRect(right + b * pw, 20 + a * ph, pw, ph);
    }
  }
  ctx.globalAlpha = 1;
  ctx.strokeStyle = "#ffffff";
  ctx.lineWidth = 1;
  for (let a = 0; a <= gh; a++) ctx.strokeRect(right, 20 + a * ph, W * px, 0);
  for (let b = 0; b <= gw; b++) ctx.strokeRect(right + b * pw, 20, 0, H * px);
  ctx.fillStyle = "#667085";
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "top";
  const what = state.imageLayer < 0 ? "rollout through all layers" :
    `layer ${r.layer_index[state.imageLayer]}, head ${state.imageHead}`;
  ctx.fillText(`[CLS] → patch attention: ${what} (brightest = ${top.toFixed(3)})`, 2, 2);
  canvas.dataset.layer = state.imageLayer < 0 ? "rollout" : String(r.layer_index[state.imageLayer]);
  canvas.dataset.head = String(state.imageHead);
  canvas.dataset.signature = signature(map);
}

function selectImageMap() {
  state.imageLayer = parseInt($("image-layer").value, 10);
  state.imageHead = parseInt($("image-head").value, 10);
  $("image-head").disabled = state.imageLayer < 0;
  drawImage();
}

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`cannot read ${file.name}`));
    reader.readAsDataURL(file);
  });
}

async function runImage() {
  const file = $("image-input").files[0];
  if (!file) {
    setStatus("choose an image file first", true);
    return;
  }
  if (file.size > state.info.max_upload_bytes) {
    setStatus(`${file.name} is ${file.size} bytes; the explorer takes at most ${state.info.max_upload_bytes}`, true);
    return;
  }
  setStatus("running the model…", false, "image");
  $("run-image").disabled = true;
  try {
    const image = await readFile(file);
    const r = await api("/api/image", { image, resize: $("image-resize").checked });
    state.image = r;
    const select = $("image-layer");
    const keep = select.value;
    select.innerHTML = '<option value="-1">rollout (all layers)</option>';
    r.layer_index.forEach((l, i) => {
      const option = document.createElement("option");
      option.value = String(i);
      option.textContent = `layer ${l}`;
      select.appendChild(option);
    });
    select.value = keep && parseInt(keep, 10) < r.layers.length ? keep : "-1";
    fillSelect($("image-head"), r.layers.length ? r.layers[0].length : 0, "head");
    $("image-head").value = String(Math.min(state.imageHead, state.info.n_head - 1));
    fillBars($("image-top5"), r.top5);
    selectImageMap();
    const best = r.top5[0];
    setStatus(`${file.name}: class ${best.token} (${(100 * best.p).toFixed(1)}%); ${r.grid[0]}×${r.grid[1]} patches`, false, "image");
    state.imageRuns += 1;
    document.body.dataset.imageRuns = String(state.imageRuns);
  } catch (e) {
    setStatus(e.message, true, "image");
  } finally {
    $("run-image").disabled = false;
  }
}

function switchTab(name) {
  state.tab = name;
  const own = state.status[name] || { message: "", isError: false };
  setStatus(own.message, own.isError, name);
  document.querySelectorAll(".tab").forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
  document.querySelectorAll(".panel").forEach((p) => { p.hidden = p.id !== `panel-${name}`; });
  document.body.dataset.tab = name;
  if (name === "conv") drawConv();
}

function currentFigure() {
  return { text: $("heatmap"), image: $("image-canvas"), toy: $("toy-canvas"), conv: $("conv-canvas"),
           lens: $("lens-canvas") }[state.tab];
}

function currentData() {
  if (state.tab === "toy") return toyLast;
  if (state.tab === "conv") return convLast;
  if (state.tab === "lens") return state.lens || null;
  if (state.tab === "image") {
    if (!state.image) return null;
    return { run: state.info.run_name, map: state.imageLayer < 0 ? "rollout" : "attention",
             layer: state.imageLayer < 0 ? null : state.image.layer_index[state.imageLayer],
             head: state.imageLayer < 0 ? null : state.imageHead, grid: state.image.grid,
             values: currentImageMap(), top5: state.image.top5 };
  }
  const matrix = currentMatrix();
  if (!matrix) return null;
  return {
    run: state.info && state.info.run_name, tokens: state.result.tokens,
    layer: state.result.layer_index[state.layer], head: state.head, attention: matrix,
    next_token: state.result.next_token, masked: state.result.masked,
  };
}

function saveBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function downloadPNG() {
  currentFigure().toBlob((blob) => saveBlob(blob, `attnlab-${state.tab}.png`), "image/png");
}

function downloadJSON() {
  const data = currentData();
  if (!data) {
    setStatus("nothing to download yet: run the model first", true);
    return;
  }
  saveBlob(new Blob([JSON.stringify(data, null, 1)], { type: "application/json" }), `attnlab-${state.tab}.json`);
}

// ---------- start-up ----------

async function init() {
  document.querySelectorAll(".tab").forEach((b) => b.addEventListener("click", () => switchTab(b.dataset.tab)));
  $("download-png").addEventListener("click", downloadPNG);
  $("download-json").addEventListener("click", downloadJSON);
  $("text-form").addEventListener("submit", (e) => { e.preventDefault(); runModel(); });
  $("layer").addEventListener("change", (e) => selectLayer(parseInt(e.target.value, 10)));
  $("head").addEventListener("change", (e) => selectHead(parseInt(e.target.value, 10)));
  $("conv-layer").addEventListener("change", (e) => selectLayer(parseInt(e.target.value, 10)));
  $("conv-head").addEventListener("change", (e) => selectHead(parseInt(e.target.value, 10)));
  $("heatmap").addEventListener("mousemove", (e) => {
    const row = heatmapRowAt(e);
    if (row !== state.hoverRow) setHoverRow(row);
  });
  $("heatmap").addEventListener("mouseleave", () => setHoverRow(null));
  $("toy-scale").addEventListener("change", computeToy);
  $("toy-causal").addEventListener("change", computeToy);
  $("toy-reset").addEventListener("click", resetToy);
  for (const id of ["conv-k", "conv-causal"]) $(id).addEventListener("change", drawConv);
  $("conv-depth").addEventListener("input", () => { $("conv-depth-value").value = $("conv-depth").value; drawConv(); });
  $("conv-canvas").addEventListener("click", convClick);
  $("image-form").addEventListener("submit", (e) => { e.preventDefault(); runImage(); });
  $("image-layer").addEventListener("change", selectImageMap);
  $("image-head").addEventListener("change", selectImageMap);
  drawImage();
  buildToyInputs();
  computeToy();
  drawConv();
  try {
    state.info = await api("/api/info");
  } catch (e) {
    setStatus(`cannot reach the explorer server: ${e.message}`, true);
    return;
  }
  const info = state.info;
  if (!info.supported) {
    $("run-info").textContent = `run ${info.run_name} (${info.family})`;
    setStatus(info.message, true);
    $("run").disabled = true;
    document.body.dataset.ready = "1";
    return;
  }
  if (info.input === "image") { // a vit: the Image tab replaces the Text tab
    $("run-info").textContent = `run ${info.run_name}: ${info.family}, ${info.n_layer} layers × ${info.n_head} heads, ` +
      `${info.image_size}×${info.image_size} ${info.in_channels === 1 ? "grey" : "RGB"} images`;
    $("tab-text").hidden = true;
    $("tab-image").hidden = false;
    $("image-limit").textContent = `${info.image_size}×${info.image_size} pixels (or tick resize), ` +
      `at most ${Math.floor(info.max_upload_bytes / 1024)} KiB`;
    switchTab("image");
    setStatus("choose an image and run the model");
    document.body.dataset.ready = "1";
    return;
  }
  if (isBert()) {
    $("next-token-box").hidden = true;
    $("mask-box").hidden = false;
  }
  $("run-info").textContent = `run ${info.run_name}: ${info.family}, ${info.n_layer} layers × ${info.n_head} heads, ` +
    `context ${info.block_size}`;
  $("text-input").maxLength = info.max_chars;
  $("text-input").value = info.example;
  $("text-limit").textContent = `at most ${info.max_tokens} tokens`;
  await runModel();
}

init();
