// Proves that a cell outliving the client's request timeout never turns into
// a timeout error. The TypeScript SDK gives up on a request after 60 s by
// default (kept here: no timeout option, no onprogress, which would reset it);
// ferrepl caps every wait at --max-wait (50 s by default), so python_exec
// {wait_s: 90} on a 70 s cell comes back in time saying "running", and
// python_wait {wait_s: 50} then collects the result. Over stdio and HTTP, run
// concurrently; this file takes about 70 s, so it holds nothing else.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { call, footerStatus, httpClient, httpServer, stdioClient, text, waitWhileRunning } from './harness.mjs';

const SEVENTY_SECONDS = "import time\ntime.sleep(70)\n'done'";

async function outlivesTheRequestTimeout(client) {
    let first;
    try {
        first = await call(client, 'python_exec', { code: SEVENTY_SECONDS, wait_s: 90 });
    } catch (err) {
        assert.fail(`python_exec did not answer within the SDK's default request timeout: ${err.message}`);
    }
    assert.equal(footerStatus(first), 'running', `expected a "running" result:\n${text(first)}`);
    assert.match(text(first), /-- running \| cell \d+ \| session default \|/);
    assert.notEqual(first.isError, true, text(first));

    const last = await waitWhileRunning(client, { wait_s: 50 }, 5);
    assert.match(text(last), /'done'/);
    assert.match(text(last), /-- ok \|/);
    assert.notEqual(last.isError, true, text(last));
}

describe('a 70 s cell with the SDK default 60 s request timeout', { concurrency: true }, () => {
    test('stdio', { timeout: 180_000 }, async (t) => {
        const { client } = await stdioClient(t);
        await outlivesTheRequestTimeout(client);
    });

    test('streamable HTTP', { timeout: 180_000 }, async (t) => {
        const server = await httpServer(t);
        await outlivesTheRequestTimeout(await httpClient(t, server.url));
    });
});
