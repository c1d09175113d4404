// attnlab explorer, the lens tab (gpt runs): knock heads out and read every layer through the unembedding.
// Uses the helpers of app.js ($, api, fillBars, showToken, setStatus, colour, state).
"use strict";

const lens = { off: new Set(), runs: 0 };  // off: "layer.head" keys of the heads knocked out

function lensHeadGrid(info) {
  const grid = $("lens-heads");
  grid.innerHTML = "";
  grid.style.gridTemplateColumns = `auto repeat(${info.n_head}, auto)`;
  for (let l = 0; l < info.n_layer; l++) {
    const label = document.createElement("span");
    label.textContent = `layer ${l}`;
    grid.appendChild(label);
    for (let h = 0; h < info.n_head; h++) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = `L${l}H${h}`;
      b.dataset.key = `${l}.${h}`;
      b.addEventListener("click", () => {
        if (lens.off.has(b.dataset.key)) lens.off.delete(b.dataset.key); else lens.off.add(b.dataset.key);
        b.classList.toggle("off", lens.off.has(b.dataset.key));
        runLens();
      });
      grid.appendChild(b);
    }
  }
}

function blankCanvas(canvas) {
  // the canvas cleared to white, with the labels' font and colour set
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.font = "12px sans-serif";
  ctx.fillStyle = "#333";
  return ctx;
}

function tokenCell(ctx, x, y, w, h, token, p, digits, textY) {
  // a cell coloured by the probability p, naming the token and p
  ctx.fillStyle = colour(p);
  ctx.fillRect(x, y, w, h);
  ctx.fillStyle = p > 0.6 ? "#000" : "#fff";
  ctx.fillText(`${showToken(token)} ${p.toFixed(digits)}`, x + 4, y + textY);
}

function drawLens(view) {
  const canvas = $("lens-canvas");
  const k = 5;
  const rowH = 30, labelW = 80, cellW = Math.floor((canvas.width - labelW) / k);
  canvas.height = rowH * (view.layers.length + 1) + 8;
  const ctx = blankCanvas(canvas);
  ctx.fillText("layer (loss over the text)", 4, 18);
  ctx.fillText(`top ${k} next tokens after the text, by the layer's stream`, labelW + 4, 18);
  view.layers.forEach((layer, i) => {
    const y = rowH * (i + 1) + 4;
    ctx.fillStyle = "#333";
    ctx.fillText(layer.name, 4, y + 13);
    if (layer.loss !== null) ctx.fillText(`(${layer.loss.toFixed(2)})`, 4, y + 26);
    layer.top.slice(0, k).forEach(({ token, p }, j) => {
      tokenCell(ctx, labelW + j * cellW, y, cellW - 3, rowH - 4, token, p, 3, 17);
    });
  });
}

function drawLensGrid(view) {
  // rows: positions (their token); columns: layers; a cell: the top next token of that layer's stream there
  const canvas = $("lens-grid");
  const names = view.layers.map((layer) => layer.name);
  const rowH = 22, labelW = 90, headH = 22;
  const cellW = Math.max(60, Math.floor((canvas.width - labelW) / Math.max(1, names.length)));
  canvas.width = Math.max(640, labelW + cellW * names.length);
  canvas.height = headH + rowH * view.grid.length + 4;
  const ctx = blankCanvas(canvas);
  ctx.fillText("position", 4, 15);
  names.forEach((name, j) => ctx.fillText(name, labelW + j * cellW + 4, 15));
  view.grid.forEach((row, t) => {
    const y = headH + t * rowH;
    ctx.fillStyle = "#333";
    ctx.fillText(`${t} ${showToken(row.token)}`, 4, y + 15);
    row.top.forEach(({ token, p }, j) => {
      tokenCell(ctx, labelW + j * cellW, y, cellW - 3, rowH - 3, token, p, 2, 14);
    });
  });
  canvas.dataset.cells = String(view.grid.length * names.length);
}

async function runLens() {
  const text = $("lens-input").value;
  const ablate = [...lens.off].map((key) => key.split(".").map((v) => parseInt(v, 10)));
  const run = ++lens.runs;
  setStatus("running the lens…", false, "lens");
  let view;
  try {
    view = await api("/api/lens", { text, ablate, how: $("lens-how").value });
  } catch (e) {
    if (run === lens.runs) setStatus(e.message, true, "lens");
    return;
  }
  if (run !== lens.runs) return;  // a newer click already asked again
  state.lens = view;
  fillBars($("lens-plain"), view.next_token);
  fillBars($("lens-ablated"), view.ablated_next_token || []);
  const loss = view.loss === null ? "" : ` Loss over the text ${view.loss.toFixed(4)}` +
    (view.ablated_loss === null ? "." : ` → ${view.ablated_loss.toFixed(4)} with ${view.heads.join(", ")} out.`);
  $("lens-loss").textContent = (view.heads.length ? `${view.heads.length} head(s) knocked out (${view.how}).` :
    "No head knocked out: click one.") + loss;
  drawLens(view);
  drawLensGrid(view);
  setStatus(`lens of ${view.tokens.length} tokens`, false, "lens");
  document.body.dataset.lensRuns = String(run);
}

async function initLens() {
  let info;
  try {
    info = await api("/api/info");
  } catch (e) {
    return;  // app.js reports an unreachable server
  }
  if (!info.supported || info.family !== "gpt") return;
  $("tab-lens").hidden = false;
  $("lens-input").maxLength = info.max_chars;
  $("lens-input").value = info.example;
  lensHeadGrid(info);
  $("lens-form").addEventListener("submit", (e) => { e.preventDefault(); runLens(); });
  $("lens-how").addEventListener("change", runLens);
  $("tab-lens").addEventListener("click", () => { if (!state.lens) runLens(); });
}

initLens();
