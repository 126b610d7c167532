// Validates Kubernetes custom resources against their operators' own CRD schemas, as the
// kubernetes-models packages compile them: Strimzi's (kafka.strimzi.io, from the CRDs of
// its releases) and the Prometheus operator's (monitoring.coreos.com, from its API types).
// Reads a JSON array of objects on stdin; prints a JSON array of one line per error
// ("Kind/name: where what"); an object of another API group is an error, so nothing passes
// unvalidated. Exit 0 when it could read its input, whatever it found.
const PACKAGES = {
  "kafka.strimzi.io": "@kubernetes-models/strimzi-kafka-operator",
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
};

async function errorsOf(object) {
  const name = `${object.kind}/${object.metadata?.name}`;
  const [group, version] = String(object.apiVersion).split("/");
  const pkg = PACKAGES[group];
  if (!pkg) return [`${name}: no schema for API group ${group}`];
  let model;
  try {
    model = (await import(`${pkg}/${group}/${version}/${object.kind}`))[object.kind];
  } catch {
    return [`${name}: no schema for ${object.apiVersion} ${object.kind}`];
  }
  try {
    new model(object).validate();
    return [];
  } catch (error) {
    const found = error.errors ?? [{ instancePath: "", message: error.message }];
    return found.map((e) => `${name}: ${e.instancePath || "/"} ${e.message}`);
  }
}

let input = "";
for await (const chunk of process.stdin) input += chunk;
const errors = [];
for (const object of JSON.parse(input)) errors.push(...(await errorsOf(object)));
process.stdout.write(JSON.stringify(errors) + "\n");
