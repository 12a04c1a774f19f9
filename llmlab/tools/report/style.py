"""The page's style sheet, inlined in its <head>: GitHub-like colours, a grid of runs side by side."""

CSS = """
:root { --fg:#1f2328; --muted:#656d76; --line:#d0d7de; --bg:#f6f8fa; --ok:#1a7f37; --okb:#dafbe1;
  --bad:#cf222e; --badb:#ffebe9; --na:#9a6700; --nab:#fff8c5; --acc:#0969da; }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color:var(--fg); background:#fff; }
header, main { max-width: 1500px; margin: 0 auto; padding: 0 28px; }
header { padding-top: 22px; padding-bottom: 8px; }
h1 { font-size: 26px; margin: 0 0 2px; }
h2 { font-size: 21px; margin: 0 0 12px; padding-bottom: 6px; border-bottom: 2px solid var(--fg); }
h3 { font-size: 15px; margin: 0 0 6px; }
h4 { font-size: 15px; margin: 0; }
a { color: var(--acc); text-decoration: none; } a:hover { text-decoration: underline; }
code { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.sub, .muted, .file, .meta, .cid { color: var(--muted); }
.cards { display:flex; flex-wrap:wrap; gap:14px; margin:14px 0; }
.card { border:1px solid var(--line); border-radius:8px; padding:12px 14px; background:var(--bg);
  min-width:380px; flex:1 1 420px; max-width:720px; }
.dev { font-weight:500; color:var(--muted); font-size:.9em; }
table { border-collapse: collapse; }
table.kv th { text-align:left; font-weight:500; color:var(--muted); padding:1px 12px 1px 0; vertical-align:top;
  white-space:nowrap; }
table.kv td { padding:1px 0; }
table.summary { margin: 6px 0 12px; }
table.summary th, table.summary td { padding:4px 14px 4px 0; text-align:left; border-bottom:1px solid var(--line);
  vertical-align:top; }
section.lab { margin: 30px 0 12px; }
.grid { display:grid; column-gap:28px; row-gap:6px; overflow-x:auto; }
.part-title { grid-column: 1 / -1; margin-top:14px; padding-top:8px; border-top:1px solid var(--line); }
.q { color: var(--muted); font-style: italic; }
.cell { min-width:0; }
.cell.head { background:var(--bg); border-radius:8px; padding:10px 12px; }
.machine { font-weight:600; font-size:15px; }
.cmd code { color:#24292f; word-break: break-all; }
.file { font-size:12px; }
.headline { font-size:15px; margin:4px 0 8px; font-weight:500; }
.tw { overflow-x:auto; }
table.data, table.verdicts { width:100%; font-size:13px; margin:4px 0; }
table.data { width:auto; min-width:min(100%, 560px); }
.tv { display:flex; flex-wrap:wrap; column-gap:32px; align-items:flex-start; }
.tv > div { min-width:0; max-width:100%; }  /* a 4-column table does not stretch over 1,400 px */
table.data th, table.verdicts th { text-align:left; font-weight:600; padding:4px 8px;
  border-bottom:2px solid var(--line); vertical-align:bottom; }
table.data td, table.verdicts td { padding:3px 8px; border-bottom:1px solid #eaeef2; vertical-align:top; }
table.data .num { text-align:right; font-variant-numeric: tabular-nums; white-space:nowrap; }
table.data tbody tr:nth-child(even) { background:#fafbfc; }
table.verdicts td:nth-child(2), table.verdicts td:nth-child(3) { font-variant-numeric: tabular-nums; }
caption { caption-side: bottom; text-align:left; color:var(--muted); font-size:12px; padding-top:2px; }
.cid { font: 11px ui-monospace, Menlo, Consolas, monospace; }
.note { color: var(--muted); font-size:12px; margin-top:2px; }
tr.v-bad td:first-child { border-left:3px solid var(--bad); }
tr.v-ok td:first-child { border-left:3px solid var(--ok); }
tr.v-na td:first-child { border-left:3px solid #d4a72c; }
.pill { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:600;
  white-space:nowrap; }
.pill.ok { color:var(--ok); background:var(--okb); }
.pill.bad { color:var(--bad); background:var(--badb); }
.pill.na { color:var(--na); background:var(--nab); }
img.plot { display:block; width:auto; max-width:100%; height:auto; margin:6px 0; }
figure { margin: 0 0 10px; } .cap { color: var(--muted); font-size:12px; }
ul.notes { margin:4px 0; padding-left:18px; color:#3d444d; }
.warn { color:var(--na); background:var(--nab); padding:6px 10px; border-radius:6px; }
.jnote { color:var(--na); font-size:12px; margin:6px 0 0; }
details { margin: 14px 0; } summary { cursor:pointer; color:var(--acc); }
.older { border-left:3px solid var(--line); padding-left:14px; margin:10px 0; }
"""
