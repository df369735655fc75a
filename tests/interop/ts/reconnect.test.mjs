// Proves that over streamable HTTP a cell's result is not lost with its client:
// client A (a separate process) starts a cell that waits for a file, and is
// SIGKILLed mid-call; once the file exists, a NEW client (a new transport
// session) gets the result from python_wait — fresh, or re-delivered with a
// "sent again" note if the orphaned call took it. And that python_wait
// after a finished, already returned cell returns that result again, saying so.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { call, defer, delay, footerStatus, httpClient, httpServer, text, waitWhileRunning } from './harness.mjs';

const HOLD_CALL = path.join(path.dirname(fileURLToPath(import.meta.url)), 'hold-call.mjs');
const WAIT_FOR_GO = "import time, pathlib\nwhile not pathlib.Path('go').exists(): time.sleep(0.05)\n'finished'";

/** Starts hold-call.mjs (client A); returns { proc, exited, output() }. Killed after the test. */
function startClientA(t, url, args) {
    const proc = spawn(process.execPath, [HOLD_CALL, url, JSON.stringify(args)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    proc.stdout.on('data', (c) => { output += c; });
    proc.stderr.on('data', (c) => { output += c; });
    let gone = false;
    const exited = new Promise((resolve) => proc.once('exit', (code, signal) => { gone = true; resolve({ code, signal }); }));
    defer(t, async () => {
        if (!gone) proc.kill('SIGKILL');
        await exited;
    });
    return { proc, exited, isGone: () => gone, output: () => output };
}

describe('results survive their HTTP client', { concurrency: true }, () => {
    test('a new client collects the result of a killed client\'s cell', { timeout: 90_000 }, async (t) => {
        const server = await httpServer(t);
        const watcher = await httpClient(t, server.url);
        const a = startClientA(t, server.url, { code: WAIT_FOR_GO, wait_s: 40 });

        // Wait (by polling the server) until client A's cell runs.
        const deadline = Date.now() + 30_000;
        for (;;) {
            const sessions = text(await call(watcher, 'python_sessions', {}));
            if (/busy/.test(sessions)) break;
            if (a.isGone()) assert.fail(`client A ended before its cell ran:\n${a.output()}`);
            if (Date.now() > deadline) assert.fail(`no session became busy within 30 s; last python_sessions:\n${sessions}`);
            await delay(50);
        }
        a.proc.kill('SIGKILL');
        assert.equal((await a.exited).signal, 'SIGKILL', `client A had already ended:\n${a.output()}`);

        writeFileSync(path.join(server.workdir, 'go'), '');
        const fresh = await httpClient(t, server.url);
        const result = await waitWhileRunning(fresh, {});
        assert.match(text(result), /'finished'/);
        assert.match(text(result), /-- ok \|/);
        assert.equal(footerStatus(result), 'ok', text(result));
    });

    test('python_wait after a returned result delivers it again', { timeout: 60_000 }, async (t) => {
        const server = await httpServer(t);
        const client = await httpClient(t, server.url);
        const first = await call(client, 'python_exec', { code: '6*7' });
        assert.equal(footerStatus(first), 'ok', text(first));
        assert.match(text(first), /^42$/m);
        assert.doesNotMatch(text(first), /sent again/i);

        const again = await call(client, 'python_wait', {});
        assert.match(text(again), /^42$/m);
        assert.match(text(again), /sent again/i);
        assert.equal(footerStatus(again), 'ok', text(again));
        assert.match(text(again), /-- ok \| cell \d+ \| session default \|/);
        // The same cell as the first result.
        assert.equal(text(again).match(/\| cell (\d+) \|/)[1], text(first).match(/\| cell (\d+) \|/)[1]);
    });
});
