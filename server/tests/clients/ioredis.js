// ioredis against `turnstile serve`: `multi()` (MULTI ... EXEC), `pipeline()`, a bad command
// inside a transaction. Prints one JSON object.
//
//     NODE_PATH=.../node_modules node ioredis.js PORT [PASSWORD]
let Redis;
try {
  Redis = require("ioredis");
} catch (e) {
  process.stderr.write(
    `ioredis.js: ioredis is missing (${e.message}): run \`cargo xtask test\`, which installs it ` +
      "into target/test-deps/node and sets TURNSTILE_TEST_NODE_PATH\n"
  );
  process.exit(2);
}

async function main() {
  const [port, password] = [Number(process.argv[2]), process.argv[3]];
  const r = new Redis({ host: "127.0.0.1", port, password, maxRetriesPerRequest: 0 });
  const out = {};
  const attempt = async (f) => {
    try {
      return await f();
    } catch (e) {
      return { error: e.name, message: e.message };
    }
  };
  out.multi = await attempt(() =>
    r.multi().call("CL.THROTTLE", "js", 5, 10, 60).call("CL.THROTTLE", "js", 5, 10, 60).exec()
  );
  out.pipeline = await attempt(() =>
    r.pipeline().call("CL.THROTTLE", "js", 5, 10, 60).ping().exec()
  );
  out.multi_bad = await attempt(() =>
    r.multi().call("CL.THROTTLE", "jsbad", 5, 10, 60).call("NO.SUCH.COMMAND").exec()
  );
  out.after_bad = await attempt(() => r.call("CL.THROTTLE", "jsbad", 5, 10, 60, 0));
  // Errors are objects: keep their message.
  const plain = (v) => JSON.parse(JSON.stringify(v, (k, x) => (x instanceof Error ? { error: x.message } : x)));
  console.log(JSON.stringify(plain(out)));
  r.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
