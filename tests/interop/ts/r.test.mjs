// R sessions through the official TypeScript SDK over stdio: with
// `--languages python,r` (and the default tool groups, text-only results)
// the R tools are listed, r_exec prints a value as the R console does, and a
// plot comes back as an MCP image content block holding a PNG.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { call, footerStatus, stdioClient, text } from './harness.mjs';

const R_ARGS = ['--languages', 'python,r'];
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

describe('R sessions over stdio', { concurrency: true }, () => {
    test('r_exec 1+1 answers [1] 2 in session r', { timeout: 60_000 }, async (t) => {
        const { client, stderr } = await stdioClient(t, R_ARGS);
        const { tools } = await client.listTools();
        const names = tools.map((tool) => tool.name);
        for (const name of ['r_exec', 'r_wait', 'r_output', 'r_inspect', 'r_install']) {
            assert.ok(names.includes(name), `${name} is not listed: ${names.join(', ')}`);
        }

        const result = await call(client, 'r_exec', { code: '1+1', wait_s: 30 });
        assert.notEqual(result.isError, true, `${text(result)}\nserver stderr:\n${stderr()}`);
        assert.match(text(result), /^\[1\] 2$/m);
        assert.equal(footerStatus(result), 'ok', text(result));
        assert.match(text(result), /-- ok \| cell \d+ \| session r \|/);
    });

    test('a plot is one image/png content block', { timeout: 60_000 }, async (t) => {
        const { client, stderr } = await stdioClient(t, R_ARGS);
        const result = await call(client, 'r_exec', { code: 'plot(1:10)', wait_s: 30 });
        assert.notEqual(result.isError, true, `${text(result)}\nserver stderr:\n${stderr()}`);
        assert.equal(footerStatus(result), 'ok', text(result));
        const images = result.content.filter((block) => block.type === 'image');
        assert.equal(images.length, 1, `content types: ${result.content.map((b) => b.type).join(', ')}\n${text(result)}`);
        assert.equal(images[0].mimeType, 'image/png');
        const png = Buffer.from(images[0].data, 'base64');
        assert.ok(png.subarray(0, 8).equals(PNG_SIGNATURE), `not a PNG: ${png.subarray(0, 8).toString('hex')}`);
        assert.equal(png.subarray(12, 16).toString('latin1'), 'IHDR');
        const [width, height] = [png.readUInt32BE(16), png.readUInt32BE(20)];
        assert.ok(width >= 665 && width <= 735 && height >= 475 && height <= 525, `size ${width}x${height}, expected about 700x500`);
        assert.match(text(result), /\[image 1: image\/png/);
    });
});
