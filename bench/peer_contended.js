// peer_contended.js -- the peers of `dlock bench contended -H`, in the
// same run (bench/bench-redis.sh, bench/bench-zk.sh; `make bench` only,
// never CI): P processes fight for one name, each holding it HOLD_US
// microseconds before it lets go, for SECS seconds; acquisitions/s over
// all of them. The peers are the issue's: node-redlock (over ioredis) on
// Redis, and a ZooKeeper lock recipe over node-zookeeper-client (kazoo's
// Lock: an ephemeral sequential node, a watch on the one before it), as
// kazoo has no node port. bench/peers.sh installs the packages under
// build/bench-peers (npm).
//
// Usage: node peer_contended.js redis|zk HOST:PORT PROCS HOLD_US SECS
// Prints one line: "peer <what>: P processes ... acquisitions/s N".
'use strict';
const { fork } = require('child_process');

const [kind, addr, procsArg, holdArg, secsArg] = process.argv.slice(2);
const procs = Number(procsArg), holdUs = Number(holdArg), secs = Number(secsArg);
const NAME = 'dlock-bench-peer';
const sleeper = new Int32Array(new SharedArrayBuffer(4));

// Hold the lock HOLD_US: a sleep of the whole process, as a holder that
// works would (nothing else is due while it holds).
function hold() {
    if (holdUs > 0) Atomics.wait(sleeper, 0, 0, holdUs / 1000);
}

// Say this process is connected, and wait for the parent's word that
// every one is: the loops start together (node starts slowly on a loaded
// machine), and the parent times them.
function ready() {
    return new Promise((ok) => {
        process.once('message', ok);
        process.send({ ready: true });
    });
}

function version(pkg) {
    return require(pkg + '/package.json').version;
}

// Redis: node-redlock on one ioredis connection, retrying every 1 ms
// (+ up to 1 ms jitter) instead of its default 200 ms: its best under
// contention (it has no notification of a release).
async function redisLoop() {
    const Redis = require('ioredis');
    const Redlock = require('redlock');
    const [host, port] = addr.split(':');
    const client = new Redis({ host, port: Number(port), retryStrategy: () => null });
    const redlock = new Redlock([client], { retryCount: -1, retryDelay: 1, retryJitter: 1 });
    await client.ping();
    await ready();
    const until = Date.now() + secs * 1000;
    let n = 0;
    while (Date.now() < until) {
        const lock = await redlock.lock(NAME, 30000);
        n++;
        hold();
        await lock.unlock();
    }
    client.disconnect();
    return n;
}

// ZooKeeper: kazoo's Lock recipe (kazoo/recipe/lock.py) -- an ephemeral
// sequential child of /NAME, held when it is the lowest; else wait for
// the deletion of the one just before it, and look again.
async function zkLoop() {
    const zookeeper = require('node-zookeeper-client');
    const client = zookeeper.createClient(addr, { sessionTimeout: 10000 });
    await new Promise((ok) => client.once('connected', ok).connect());
    const base = '/' + NAME;
    const call = (f, ...a) => new Promise((ok, no) => f.call(client, ...a, (e, r) => (e ? no(e) : ok(r))));
    try {
        await call(client.mkdirp, base);
    } catch (e) {
        /* another process made it */
    }
    await ready();
    const until = Date.now() + secs * 1000;
    let n = 0;
    while (Date.now() < until) {
        const me = await call(client.create, base + '/lock-', null, zookeeper.CreateMode.EPHEMERAL_SEQUENTIAL);
        const mine = me.slice(base.length + 1);
        for (;;) {
            const kids = (await call(client.getChildren, base)).sort();
            const i = kids.indexOf(mine);
            if (i === 0) break;
            const prev = base + '/' + kids[i - 1];
            const gone = new Promise((ok) => {
                client.exists(prev, () => ok(), (e, stat) => {
                    if (e || !stat) ok();
                });
            });
            await gone;
        }
        n++;
        hold();
        await call(client.remove, me, -1);
    }
    client.close();
    return n;
}

if (process.env.PEER_CHILD) {
    (kind === 'redis' ? redisLoop : zkLoop)().then(
        (n) => process.send({ n }, () => process.exit(0)),
        (e) => {
            process.send({ err: String((e && e.message) || e) }, () => process.exit(1));
        });
} else {
    const what = kind === 'redis'
        ? `node-redlock ${version('redlock')} + ioredis ${version('ioredis')} (retry 1 ms)`
        : `kazoo's Lock recipe on node-zookeeper-client ${version('node-zookeeper-client')}`;
    const env = { ...process.env, PEER_CHILD: '1' };
    let total = 0, left = procs, waiting = procs, failed = '';
    const children = [];
    for (let i = 0; i < procs; i++) {
        const child = fork(__filename, process.argv.slice(2), { env });
        children.push(child);
        child.on('message', (m) => {
            if (m.ready) {
                if (--waiting === 0) children.forEach((c) => c.send({ go: true }));
            } else if (m.err) {
                failed = m.err;
                children.forEach((c) => c.kill()); /* those waiting for the start too */
            } else {
                total += m.n;
            }
        });
        child.on('exit', () => {
            if (--left > 0) return;
            if (failed) {
                console.log(`peer ${what}: failed: ${failed}`);
                process.exit(1);
            }
            console.log(`peer ${what}: ${procs} processes on one name, hold ${holdUs} us, ` +
                        `${secs} s: acquisitions/s ${(total / secs).toFixed(1)}`);
        });
    }
}
