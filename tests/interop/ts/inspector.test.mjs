// Proves that the MCP Inspector's CLI (@modelcontextprotocol/inspector 2.x,
// `--cli ... --method tools/list --strict`) finds nothing to report about
// ferrepl's tool schemas: exit 0 and no "Warning:"/"Error:" findings, no
// summary, no JSON error envelope, nothing else on stderr (Ajv's "unknown
// format ... ignored" included), for the default profile, `--tools all` and
// `--tools all --structured-content`; that a tools/call of python_exec
// through it answers "2" for "1+1"; and that a cell longer than its wait_s
// comes back as a whole `running` result (content, the status in
// structuredContent), never a task: the CLI declares the tasks extension at
// initialize but cannot follow a task (it printed `content: []` and exited
// when ferrepl sent one).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import { BIN, packageDir, serverDirs } from './harness.mjs';

// The CLI entry point, as the package's "bin" declares it (the launcher; --cli selects the CLI).
const PKG = packageDir('@modelcontextprotocol/inspector');
const INSPECTOR = path.join(PKG, JSON.parse(readFileSync(path.join(PKG, 'package.json'), 'utf8')).bin['mcp-inspector']);

/**
 * Runs `inspector --cli <inspectorArgs> -- ferrepl --workdir DIR --state-dir STATE <serverArgs>`
 * with this Node (22+); resolves to { code, stdout, stderr }.
 */
function inspector(t, inspectorArgs, serverArgs) {
    const { args: dirs } = serverDirs(t);
    const args = [INSPECTOR, '--cli', ...inspectorArgs, '--', BIN, ...dirs, ...serverArgs];
    return new Promise((resolve, reject) => {
        const proc = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
        let stdout = '';
        let stderr = '';
        proc.stdout.on('data', (c) => { stdout += c; });
        proc.stderr.on('data', (c) => { stderr += c; });
        const timer = setTimeout(() => proc.kill('SIGKILL'), 60_000);
        proc.on('error', reject);
        proc.on('close', (code, signal) => {
            clearTimeout(timer);
            resolve({ code, signal, stdout, stderr });
        });
    });
}

// ferrepl's own log lines, which the Inspector passes through from the
// server's stderr: `2026-01-01T00:00:00.000000Z  INFO target: message`.
const SERVER_LOG = /^\d{4}-\d\d-\d\dT[\d:.]+Z\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s/;

/** What the run reported besides the result: any stderr line that is not a quiet server log line. */
function findings({ stderr }) {
    return stderr.split('\n').filter((line) => {
        if (line.trim() === '') return false;
        const log = line.match(SERVER_LOG);
        return !log || log[1] === 'WARN' || log[1] === 'ERROR';
    });
}

function assertClean(run) {
    const extra = findings(run);
    assert.ok(extra.length === 0, `the Inspector reported (exit ${run.code}):\n${extra.join('\n')}`);
    assert.equal(run.code, 0, `the Inspector exited ${run.code ?? run.signal}; stderr:\n${run.stderr}`);
    assert.doesNotMatch(run.stdout, /^\s*(Warning|Error)\b/im);
}

describe('MCP Inspector CLI', { concurrency: true }, () => {
    for (const serverArgs of [[], ['--tools', 'all'], ['--tools', 'all', '--structured-content']]) {
        test(`tools/list --strict is clean: ferrepl ${serverArgs.join(' ') || '(default tools)'}`, { timeout: 90_000 }, async (t) => {
            const run = await inspector(t, ['--method', 'tools/list', '--strict'], serverArgs);
            assertClean(run);
            const names = JSON.parse(run.stdout).tools.map((tool) => tool.name);
            assert.ok(names.includes('python_exec'), names.join(', '));
            if (serverArgs.includes('all')) assert.ok(names.includes('file_write'), names.join(', '));
        });
    }

    test('tools/call python_exec {"code": "1+1"} answers 2', { timeout: 90_000 }, async (t) => {
        const run = await inspector(
            t,
            ['--method', 'tools/call', '--tool-name', 'python_exec', '--tool-args-json', '{"code": "1+1"}'],
            [],
        );
        assertClean(run);
        const result = JSON.parse(run.stdout);
        assert.notEqual(result.isError, true, run.stdout);
        const text = result.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');
        assert.match(text, /^2$/m);
        assert.match(text, /-- ok \|/);
    });

    test('tools/call of a 3 s cell with wait_s 1 comes back running, with content', { timeout: 90_000 }, async (t) => {
        const args = { code: "import time\nprint('begun')\ntime.sleep(3)\n'late'", wait_s: 1 };
        const run = await inspector(
            t,
            ['--method', 'tools/call', '--tool-name', 'python_exec', '--tool-args-json', JSON.stringify(args)],
            ['--structured-content'],
        );
        assertClean(run);
        const result = JSON.parse(run.stdout);
        assert.equal(result.taskId, undefined, run.stdout);
        assert.notEqual(result.resultType, 'task', run.stdout);
        assert.notEqual(result.isError, true, run.stdout);
        assert.ok(Array.isArray(result.content) && result.content.length > 0, run.stdout);
        const text = result.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');
        assert.match(text, /python_wait/);
        assert.match(text, /^-- running \| cell 1 \| session default \|/m);
        assert.equal(result.structuredContent?.status, 'running', run.stdout);
    });
});
