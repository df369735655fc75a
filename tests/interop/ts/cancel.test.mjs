// Proves that cancelling a tools/call from the TypeScript SDK (AbortController,
// which sends notifications/cancelled) interrupts the running cell and keeps
// the session: python_wait then shows the cell ended "interrupted" with a
// KeyboardInterrupt (unless the server already collected it), and a variable
// set before the interrupt survives (x + 1 == 42). The abort is sent upon the
// first progress notification, which the server sends only once the cell
// runs, so the cancel never races the start of the cell. A cancel is normal
// client behaviour: the server logs nothing at ERROR or WARN for it. Stdio
// and HTTP.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { call, footerStatus, httpClient, httpServer, stdioClient, text, waitWhileRunning } from './harness.mjs';

const LOOP = 'import time\nx = 41\nfor i in range(600): time.sleep(0.1)\n';

async function cancelInterrupts(client) {
    const set = await call(client, 'python_exec', { code: 'x = 41' });
    assert.equal(footerStatus(set), 'ok', text(set));

    const abort = new AbortController();
    let progress = 0;
    const pending = call(client, 'python_exec', { code: LOOP, wait_s: 30 }, {
        signal: abort.signal,
        onprogress: () => {
            progress += 1;
            abort.abort(new Error('cancelled by the test'));
        },
    });
    await assert.rejects(pending, /cancelled by the test/);
    assert.ok(progress >= 1);

    const ended = await waitWhileRunning(client, {});
    if (/interrupted/.test(text(ended))) {
        assert.equal(footerStatus(ended), 'interrupted', text(ended));
        assert.match(text(ended), /KeyboardInterrupt/);
        assert.equal(ended.isError, true);
    } else {
        // The server collected the interrupted cell already: nothing runs now.
        assert.notEqual(footerStatus(ended), 'running', text(ended));
    }

    const after = await call(client, 'python_exec', { code: 'x+1' });
    assert.equal(footerStatus(after), 'ok', `the session is not idle again:\n${text(after)}`);
    assert.match(text(after), /^42$/m);
    const sessions = text(await call(client, 'python_sessions', {}));
    assert.doesNotMatch(sessions, /\bbusy\b/, sessions);
}

function assertQuietLog(log) {
    const loud = log.split('\n').filter((line) => / (ERROR|WARN) /.test(line));
    assert.deepEqual(loud, [], `a client cancel was logged as a problem:\n${log}`);
}

describe('cancelling python_exec interrupts the cell', { concurrency: true }, () => {
    test('stdio', { timeout: 90_000 }, async (t) => {
        const { client, stderr } = await stdioClient(t);
        await cancelInterrupts(client);
        assertQuietLog(stderr());
    });

    test('streamable HTTP', { timeout: 90_000 }, async (t) => {
        const server = await httpServer(t);
        await cancelInterrupts(await httpClient(t, server.url));
        assertQuietLog(server.stderr());
    });
});
