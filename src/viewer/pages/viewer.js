// ferrepl's viewer. Everything shown is written by the agent (or by
// another client of a kernel session), so it is only ever put in the page
// as text (textContent, text nodes); no markup is built from data, and
// links are fixed paths with encoded parts.
'use strict';

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = shown(String(text));
  return e;
}

// Terminal escapes and other controls are shown, not acted on.
function shown(s) {
  return s.replace(/\x1b/g, '\u241b').replace(/[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]/g, '\ufffd');
}

function link(href, text) {
  const a = el('a', null, text);
  a.href = href;
  return a;
}

function enc(s) { return encodeURIComponent(String(s)); }

function size(n) {
  if (n === null || n === undefined) return '';
  if (n < 1024) return n + ' B';
  if (n < 1048576) return (n / 1024).toFixed(1) + ' KiB';
  return (n / 1048576).toFixed(1) + ' MiB';
}

function age(s) {
  s = Math.floor(s || 0);
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min';
  return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
}

// An error as results show it: the traceback, which ends (Python) or
// starts (R) with the error itself; its type and message only without one.
function errorText(e) {
  const tb = (e.traceback || '').replace(/\s+$/, '');
  return tb || e.type + ': ' + e.message;
}

// A name cut with an ellipsis when it is too long (CSS), whole in its title.
function nameLink(href, name) {
  const a = link(href, name);
  a.className = 'name';
  a.title = shown(String(name));
  return a;
}

// Each cell of a row takes its column's heading, shown before it when a
// narrow screen stacks the cells.
function labelled(tr, table) {
  const heads = table.querySelectorAll('thead th');
  Array.from(tr.children).forEach((td, i) => { if (heads[i]) td.dataset.label = heads[i].textContent; });
  return tr;
}

function secs(ms) {
  if (ms === null || ms === undefined) return '';
  return ms < 1000 ? Math.round(ms) + ' ms' : (ms / 1000).toFixed(2) + ' s';
}

function conn(ok) {
  const c = document.getElementById('conn');
  if (!c) return;
  c.textContent = ok ? 'live' : 'reconnecting…';
  c.className = 'conn ' + (ok ? 'live' : 'down');
}

// A small highlighter: keywords, strings, comments, numbers. Text nodes only.
const KEYWORDS = {
  python: new Set(('False None True and as assert async await break class continue def del elif else ' +
    'except finally for from global if import in is lambda nonlocal not or pass raise return try ' +
    'while with yield match case').split(' ')),
  R: new Set(('if else repeat while function for in next break TRUE FALSE NULL Inf NaN NA ' +
    'NA_integer_ NA_real_ NA_character_ library require return').split(' ')),
};

function highlight(pre, code, language) {
  const kws = KEYWORDS[language] || KEYWORDS.python;
  const re = /(#[^\n]*)|("""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?)|(\b\d[\d_]*(?:\.\d*)?(?:[eE][+-]?\d+)?\b)|([A-Za-z_][A-Za-z0-9_.]*)/g;
  let last = 0;
  let m;
  while ((m = re.exec(code)) !== null) {
    if (m.index > last) pre.appendChild(document.createTextNode(shown(code.slice(last, m.index))));
    let cls = null;
    if (m[1]) cls = 'com';
    else if (m[2]) cls = 'str';
    else if (m[3]) cls = 'num';
    else if (m[4] && kws.has(m[4])) cls = 'kw';
    if (cls) pre.appendChild(el('span', cls, m[0]));
    else pre.appendChild(document.createTextNode(shown(m[0])));
    last = m.index + m[0].length;
    if (m[0].length === 0) re.lastIndex++;
  }
  if (last < code.length) pre.appendChild(document.createTextNode(shown(code.slice(last))));
}

// ---- the list of sessions and jobs ----

function indexPage() {
  const es = new EventSource('/events');
  es.onopen = () => conn(true);
  es.onerror = () => conn(false);
  es.addEventListener('sessions', (ev) => {
    const data = JSON.parse(ev.data);
    const body = document.querySelector('#sessions tbody');
    body.replaceChildren();
    for (const s of data.sessions) {
      const tr = el('tr');
      const name = el('td', 'code');
      name.appendChild(nameLink('/s/' + enc(s.name), s.name));
      tr.appendChild(name);
      tr.appendChild(el('td', null, s.language));
      tr.appendChild(el('td', 'st-' + s.state.replace(/[^a-z_]/g, ''), s.state));
      const runs = s.running_cell !== null && s.running_cell !== undefined;
      tr.appendChild(el('td', null, runs ? 'cell ' + s.running_cell : ''));
      // `cells` counts the finished ones; the running cell is one too.
      tr.appendChild(el('td', null, runs ? (s.cells + 1) + ' (1 running)' : s.cells));
      tr.appendChild(el('td', null, size(s.memory_bytes)));
      tr.appendChild(el('td', null, age(s.uptime_s)));
      body.appendChild(labelled(tr, document.getElementById('sessions')));
    }
    document.getElementById('no-sessions').hidden = data.sessions.length > 0;
    const jobs = document.querySelector('#jobs tbody');
    jobs.replaceChildren();
    for (const j of data.jobs) {
      const tr = el('tr');
      const jid = el('td', 'code');
      jid.appendChild(nameLink('/j/' + enc(j.job), j.job));
      tr.appendChild(jid);
      const cmd = el('td', 'code', j.command);
      if (j.command_cut) cmd.appendChild(el('span', 'muted', ' [… ' + size(j.command_cut) + ' more]'));
      tr.appendChild(cmd);
      tr.appendChild(el('td', null, j.status + (j.exit_code !== null && j.exit_code !== undefined ? ' (' + j.exit_code + ')' : '')));
      tr.appendChild(el('td', null, age(j.age_s)));
      const out = el('td');
      out.appendChild(link('/j/' + enc(j.job) + '/output.txt', 'output'));
      tr.appendChild(out);
      jobs.appendChild(labelled(tr, document.getElementById('jobs')));
    }
    document.getElementById('no-jobs').hidden = data.jobs.length > 0;
  });
}

// ---- one session's cells ----

// Other clients' cells a page keeps: as many as the server does
// (FOREIGN_SHOWN in src/session/foreign.rs).
const FOREIGN_SHOWN = 32;

function sessionPage() {
  const name = decodeURIComponent(location.pathname.slice(3));
  const params = new URLSearchParams(location.search);
  const head = params.get('head');
  const headQuery = head && /^\d+$/.test(head) ? '?head=' + head : '';
  const base = '/s/' + enc(name);
  const title = document.getElementById('title');
  title.textContent = shown(name);
  title.title = shown(name);
  document.title = 'ferrepl · ' + shown(name);
  // The notebook of the branch shown.
  document.getElementById('download').href = base + '/export.ipynb' + headQuery;
  const cells = document.getElementById('cells');
  const running = document.getElementById('running');
  let language = 'python';
  let path = [];
  let es = null;
  // The running cell: its code (sent once per cell) and output's end
  // (sent when it changed).
  let runCode = null;
  let runCodeNodes = [];
  let runTail = '';
  let runCell = null;

  function setState(state) {
    const s = document.getElementById('state');
    s.textContent = shown(state);
    s.className = 'badge state st-' + String(state).replace(/[^a-z_]/g, '');
  }

  function cellNode(c) {
    const art = el('article', 'cell');
    art.tabIndex = 0;
    art.dataset.cell = String(c.cell);
    const h = el('header');
    h.appendChild(el('span', 'n', '[' + c.cell + ']'));
    h.appendChild(el('span', 'st-' + c.status.replace(/[^a-z_]/g, ''), c.status));
    h.appendChild(el('span', null, secs(c.elapsed_ms)));
    if (c.parent !== undefined) h.appendChild(el('span', null, 'after cell ' + c.parent));
    art.appendChild(h);
    if (c.branches && c.branches.length) {
      const b = el('div', 'branch', '→ the history branches here; other branches: ');
      c.branches.forEach((id, i) => {
        if (i) b.appendChild(document.createTextNode(', '));
        b.appendChild(link(base + '?head=' + Number(id), 'cell ' + id));
      });
      art.appendChild(b);
    }
    const code = el('pre', 'code');
    highlight(code, c.code, language);
    art.appendChild(code);
    if (c.code_cut) art.appendChild(codeCut(c.code_cut));
    if (!c.kept) {
      art.appendChild(el('p', 'note', 'This cell\'s output is no longer kept (only recent cells\' outputs are).'));
    }
    if (c.stdout) art.appendChild(el('pre', 'out stdout', c.stdout));
    if (c.stderr) art.appendChild(el('pre', 'out stderr', c.stderr));
    for (let i = 0; i < c.images; i++) {
      const img = el('img');
      img.alt = 'image ' + (i + 1) + ' of cell ' + c.cell;
      img.src = base + '/cell/' + Number(c.cell) + '/image/' + i;
      art.appendChild(img);
    }
    if (c.value !== undefined) art.appendChild(el('pre', 'out value', c.value));
    if (c.error) art.appendChild(el('pre', 'out traceback', errorText(c.error)));
    if (c.full_output) {
      const p = el('p', 'muted');
      p.appendChild(link(base + '/cell/' + Number(c.cell) + '/output.txt', 'full output as text'));
      art.appendChild(p);
    }
    return art;
  }

  // A cell another client ran in the session's kernel: marked as theirs,
  // never numbered like the agent's (it is not in the session's path).
  function foreignNode(f) {
    const art = el('article', 'cell foreign');
    art.tabIndex = 0;
    art.dataset.foreign = String(Number(f.seq));
    art.dataset.after = String(Number(f.after));
    const h = el('header');
    h.appendChild(el('span', 'by', 'run by ' + f.by));
    h.appendChild(el('span', 'st-' + String(f.status).replace(/[^a-z_]/g, ''), f.status));
    if (f.after) h.appendChild(el('span', null, 'after cell ' + Number(f.after)));
    art.appendChild(h);
    const code = el('pre', 'code');
    highlight(code, f.code, language);
    art.appendChild(code);
    if (f.output) art.appendChild(el('pre', f.status === 'error' ? 'out traceback' : 'out stdout', f.output));
    return art;
  }

  function order() {
    const byId = new Map();
    const foreign = [];
    for (const n of Array.from(cells.children)) {
      if (n.dataset.foreign !== undefined) foreign.push(n);
      else byId.set(Number(n.dataset.cell), n);
    }
    for (const [id, n] of byId) if (!path.includes(id)) n.remove();
    // Another client's cell goes after the agent's cell it followed (the
    // numbers grow along a path), in the order they ran.
    foreign.sort((a, b) => Number(a.dataset.foreign) - Number(b.dataset.foreign));
    let f = 0;
    for (const id of path) {
      while (f < foreign.length && Number(foreign[f].dataset.after) < id) cells.appendChild(foreign[f++]);
      const n = byId.get(id);
      if (n) cells.appendChild(n);
    }
    while (f < foreign.length) cells.appendChild(foreign[f++]);
    document.getElementById('empty').hidden = path.length > 0 || foreign.length > 0 || !running.hidden;
  }

  function codeCut(n) {
    return el('p', 'note', 'The code is cut here: ' + size(n) + ' more not shown.');
  }

  function runningCode(c) {
    runCode = c;
    const code = el('pre', 'code');
    highlight(code, c.code, language);
    runCodeNodes = c.code_cut ? [code, codeCut(c.code_cut)] : [code];
  }

  function showRunning(r) {
    running.replaceChildren();
    if (!r) { running.hidden = true; runCell = null; runTail = ''; order(); return; }
    if (r.cell !== runCell) runTail = '';
    runCell = r.cell;
    if (r.output_tail !== undefined) runTail = r.output_tail;
    running.hidden = false;
    const h = el('header');
    h.appendChild(el('span', 'n', '[' + r.cell + ']'));
    h.appendChild(el('span', r.prompt !== undefined ? 'st-waiting_input' : 'st-running',
      r.prompt !== undefined ? 'waiting for input' : 'running'));
    h.appendChild(el('span', null, r.elapsed_s.toFixed(0) + ' s'));
    h.appendChild(el('span', null, size(r.output_bytes) + ' of output'));
    running.appendChild(h);
    if (runCode && runCode.cell === r.cell) for (const n of runCodeNodes) running.appendChild(n);
    if (runTail) {
      const out = el('pre', 'out stdout live', runTail);
      running.appendChild(out);
      out.scrollTop = out.scrollHeight;
    }
    if (r.output_bytes > runTail.length) {
      const p = el('p', 'muted');
      p.appendChild(link(base + '/cell/' + Number(r.cell) + '/output.txt', 'full output so far as text'));
      running.appendChild(p);
    }
    if (r.prompt !== undefined) running.appendChild(el('p', 'prompt', 'input() asks: ' + r.prompt));
    order();
  }

  function connect(fresh) {
    if (es) es.close();
    if (fresh) cells.replaceChildren();
    es = new EventSource('/events/s/' + enc(name) + headQuery);
    es.onopen = () => conn(true);
    es.onerror = () => conn(false);
    es.addEventListener('path', (ev) => {
      const d = JSON.parse(ev.data);
      language = d.language === 'r' || d.language === 'R' ? 'R' : 'python';
      document.getElementById('lang').textContent = shown(d.language);
      setState(d.state);
      path = d.path;
      const note = document.getElementById('branch-note');
      note.hidden = d.current;
      if (!d.current) {
        note.replaceChildren(document.createTextNode('This is another branch of the history, not the one the interpreter holds. '));
        note.appendChild(link(base, 'Back to the current branch'));
      }
      order();
      // Resumed after a change we missed: start again from the beginning.
      const have = new Set(Array.from(cells.children, (n) => Number(n.dataset.cell)));
      const last = Number(es.lastEventId || 0);
      if (path.some((id) => id <= last && !have.has(id))) connect(true);
    });
    es.addEventListener('cell', (ev) => {
      const c = JSON.parse(ev.data);
      const node = cellNode(c);
      const old = cells.querySelector('[data-cell="' + Number(c.cell) + '"]');
      if (old) old.replaceWith(node); else cells.appendChild(node);
      order();
    });
    // Sent again on every connection (they carry no event id): one the
    // page has is replaced, and it keeps as many as the server does.
    es.addEventListener('foreign', (ev) => {
      const f = JSON.parse(ev.data);
      const node = foreignNode(f);
      const old = cells.querySelector('[data-foreign="' + Number(f.seq) + '"]');
      if (old) old.replaceWith(node); else cells.appendChild(node);
      const all = Array.from(cells.querySelectorAll('[data-foreign]'))
        .sort((a, b) => Number(a.dataset.foreign) - Number(b.dataset.foreign));
      for (const n of all.slice(0, Math.max(all.length - FOREIGN_SHOWN, 0))) n.remove();
      order();
    });
    es.addEventListener('state', (ev) => setState(JSON.parse(ev.data)));
    es.addEventListener('running_cell', (ev) => runningCode(JSON.parse(ev.data)));
    es.addEventListener('running', (ev) => showRunning(headQuery ? null : JSON.parse(ev.data)));
    es.addEventListener('gone', () => {
      setState('gone');
      es.close();
      conn(false);
    });
  }
  connect(true);

  document.addEventListener('keydown', (ev) => {
    if (ev.target && (ev.target.tagName === 'INPUT' || ev.target.tagName === 'TEXTAREA')) return;
    const all = Array.from(document.querySelectorAll('.cell')).filter((n) => !n.hidden);
    const at = all.indexOf(document.activeElement);
    if (ev.key === 'j') { (all[at + 1] || all[all.length - 1] || document.body).focus(); ev.preventDefault(); }
    if (ev.key === 'k') { (all[Math.max(at - 1, 0)] || document.body).focus(); ev.preventDefault(); }
    if (ev.key === 'g' && !running.hidden) { running.focus(); ev.preventDefault(); }
  });
}

// ---- one shell job: its command, state and output as it comes ----

function jobPage() {
  const id = decodeURIComponent(location.pathname.slice(3));
  const base = '/j/' + enc(id);
  const title = document.getElementById('title');
  title.textContent = shown(id);
  title.title = shown(id);
  document.title = 'ferrepl · ' + shown(id);
  document.getElementById('full').href = base + '/output.txt';
  const out = document.getElementById('output');
  // Characters of output kept on the page (the full text has the rest).
  const KEEP = 256 * 1024;

  function cut() {
    const note = document.getElementById('cut');
    if (!note.hidden) return;
    note.hidden = false;
    note.replaceChildren(document.createTextNode('Earlier output is not shown here: '));
    note.appendChild(link(base + '/output.txt', 'the full output as text'));
  }

  // The browser reconnects by itself, with the last offset (Last-Event-ID).
  const es = new EventSource('/events' + base);
  es.onopen = () => conn(true);
  es.onerror = () => conn(false);
  es.addEventListener('job', (ev) => {
    const j = JSON.parse(ev.data);
    document.getElementById('command').textContent = shown(j.command);
    const cc = document.getElementById('command-cut');
    cc.hidden = !j.command_cut;
    if (j.command_cut) cc.textContent = 'The command is cut here: ' + size(j.command_cut) + ' more not shown.';
    let state = j.status;
    if (j.status !== 'running') {
      if (j.exit_code !== null && j.exit_code !== undefined) state = 'exit ' + j.exit_code;
      else if (j.signal) state = 'killed by ' + j.signal;
    }
    const s = document.getElementById('state');
    s.textContent = shown(state);
    s.className = 'badge state ' + (j.status === 'running' ? 'st-running' : j.exit_code === 0 ? 'st-ok' : 'st-error');
    document.getElementById('elapsed').textContent = age(j.age_s);
  });
  es.addEventListener('output', (ev) => {
    const o = JSON.parse(ev.data);
    const atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    if (o.cut) { out.textContent = ''; cut(); }
    if (o.text) out.appendChild(document.createTextNode(shown(o.text)));
    if (out.childNodes.length > 200 || out.textContent.length > KEEP) {
      const all = out.textContent;
      if (all.length > KEEP) cut();
      out.textContent = all.slice(-KEEP);
    }
    if (atEnd) out.scrollTop = out.scrollHeight;
  });
  es.addEventListener('gone', () => {
    const s = document.getElementById('state');
    s.textContent = 'gone';
    es.close();
    conn(false);
  });
}

document.addEventListener('DOMContentLoaded', () => {
  const page = document.body.dataset.page;
  if (page === 'index') indexPage();
  if (page === 'session') sessionPage();
  if (page === 'job') jobPage();
});
