// chart-render renders a Helm chart the way `helm template` does, so that the chart's output can be
// checked where helm cannot be installed: Helm is not packaged for Debian, but its template engine
// (Go's text/template plus the sprig functions) is. Build it offline from Debian's packaged sources:
//
//	apt-get install golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev \
//	  golang-github-xeipuuv-gojsonschema-dev
//	mkdir -p /tmp/gp/src/chart-render && cp tools/chart-render/* /tmp/gp/src/chart-render/
//	cd /tmp/gp/src/chart-render && GO111MODULE=off GOPATH=/tmp/gp:/usr/share/gocode GOFLAGS= go build -o chart-render .
//
// (scripts/chart-render.ts does this.) GOPATH mode, as Debian installs sources under
// /usr/share/gocode/src for it, and no module proxy is needed. The go.mod beside this file is there
// for one rule of GOPATH mode only: code inside a GOPATH, in a tree with a go.mod, may import sprig
// as ".../sprig/v3" ("minimal module compatibility"), hence the copy into a GOPATH of its own.
//
// Usage, like helm's: chart-render [-f values.yaml]... [--namespace NS] [--api-versions G/V]... [NAME] CHART
//
// What it does not do: subcharts, .Files.Glob/AsConfig, .helmignore, --set. What it does as Helm
// 3 does: values are decoded as JSON would be (numbers are float64) and checked against
// values.schema.json with the same library (gojsonschema), missingkey=zero with "<no value>"
// blanked, partials (_*) define templates only, NOTES.txt is rendered but not printed, manifests
// come in Helm's install order with hooks last.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"github.com/xeipuuv/gojsonschema"
	"gopkg.in/yaml.v3"
)

// The schemas the repository's test validates against are Kubernetes 1.34's (kubernetes-models 5).
const kubeVersion = "v1.34.0"

// Group/versions Capabilities.APIVersions.Has answers true for (also as "group/version/Kind"): the
// ones this chart uses, CRDs included, as if helm template were given them with --api-versions.
var apiVersions = []string{"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v1", "autoscaling/v2",
	"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "monitoring.coreos.com/v1"}

// Helm's InstallOrder; kinds not listed come after, alphabetically.
var installOrder = strings.Fields(`PriorityClass Namespace NetworkPolicy ResourceQuota LimitRange PodSecurityPolicy
	PodDisruptionBudget ServiceAccount Secret SecretList ConfigMap StorageClass PersistentVolume PersistentVolumeClaim
	CustomResourceDefinition ClusterRole ClusterRoleList ClusterRoleBinding ClusterRoleBindingList Role RoleList
	RoleBinding RoleBindingList Service DaemonSet Pod ReplicationController ReplicaSet Deployment
	HorizontalPodAutoscaler StatefulSet Job CronJob IngressClass Ingress APIService MutatingWebhookConfiguration
	ValidatingWebhookConfiguration`)

// Helm's releaseutil.SplitManifests separator.
var docSep = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// metadata is .Chart (json tags: toYaml/toJson name its fields as Helm does).
type metadata struct {
	APIVersion  string            `yaml:"apiVersion" json:"apiVersion,omitempty"`
	Name        string            `yaml:"name" json:"name,omitempty"`
	Version     string            `yaml:"version" json:"version,omitempty"`
	KubeVersion string            `yaml:"kubeVersion" json:"kubeVersion,omitempty"`
	Description string            `yaml:"description" json:"description,omitempty"`
	Type        string            `yaml:"type" json:"type,omitempty"`
	Keywords    []string          `yaml:"keywords" json:"keywords,omitempty"`
	Home        string            `yaml:"home" json:"home,omitempty"`
	Sources     []string          `yaml:"sources" json:"sources,omitempty"`
	Icon        string            `yaml:"icon" json:"icon,omitempty"`
	AppVersion  string            `yaml:"appVersion" json:"appVersion,omitempty"`
	Deprecated  bool              `yaml:"deprecated" json:"deprecated,omitempty"`
	Annotations map[string]string `yaml:"annotations" json:"annotations,omitempty"`
}

type kubeVer struct{ Version, Major, Minor string }

func (k kubeVer) String() string     { return k.Version }
func (k kubeVer) GitVersion() string { return k.Version }

type versionSet []string

func (v versionSet) Has(s string) bool {
	for _, gv := range v {
		if s == gv || strings.HasPrefix(s, gv+"/") && !strings.Contains(s[len(gv)+1:], "/") {
			return true
		}
	}
	return false
}

type capabilities struct {
	KubeVersion kubeVer
	APIVersions versionSet
	HelmVersion map[string]string
}

// files is .Files: the chart's files that are not templates, Chart.yaml or values (as Helm's loader).
type files map[string][]byte

func (f files) Get(name string) string      { return string(f[name]) }
func (f files) GetBytes(name string) []byte { return f[name] }

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func run() error {
	var valueFiles, extraAPIs list
	fl := flag.NewFlagSet("chart-render", flag.ExitOnError)
	fl.Var(&valueFiles, "f", "values file (repeatable; later ones win)")
	fl.Var(&valueFiles, "values", "same as -f")
	fl.Var(&extraAPIs, "api-versions", "more API versions for Capabilities.APIVersions (repeatable)")
	namespace := fl.String("namespace", "default", "release namespace")
	// helm takes flags before and after the positional arguments
	var pos []string
	for args := os.Args[1:]; ; {
		_ = fl.Parse(args)
		if args = fl.Args(); len(args) == 0 {
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	name, dir := "release-name", ""
	switch len(pos) {
	case 1:
		dir = pos[0]
	case 2:
		name, dir = pos[0], pos[1]
	default:
		return errors.New("usage: chart-render [-f values.yaml]... [--namespace NS] [--api-versions G/V]... [NAME] CHART")
	}

	var meta metadata
	if err := readYAML(filepath.Join(dir, "Chart.yaml"), &meta); err != nil {
		return err
	}
	if meta.Name == "" || meta.Version == "" {
		return errors.New("Chart.yaml: name and version are required")
	}
	var vals map[string]interface{}
	if err := readValues(filepath.Join(dir, "values.yaml"), &vals); err != nil {
		return err
	}
	for _, f := range valueFiles {
		var over map[string]interface{}
		if err := readValues(f, &over); err != nil {
			return err
		}
		vals = coalesce(vals, over)
	}
	if schema, err := os.ReadFile(filepath.Join(dir, "values.schema.json")); err == nil {
		j, _ := json.Marshal(vals)
		res, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(j))
		if err != nil {
			return fmt.Errorf("values.schema.json: %v", err)
		}
		if !res.Valid() {
			var b strings.Builder
			for _, e := range res.Errors() {
				fmt.Fprintf(&b, "\n- %s", e)
			}
			return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:%s", meta.Name, b.String())
		}
	}

	chartFiles, tpls := files{}, map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		switch {
		case err != nil:
			return err
		case strings.HasPrefix(rel, "templates/"):
			tpls[path.Join(meta.Name, rel)] = string(data)
		case strings.HasPrefix(rel, "charts/"):
			return fmt.Errorf("%s: subcharts are not supported", rel)
		case rel != "Chart.yaml" && rel != "Chart.lock" && rel != "values.yaml" && rel != "values.schema.json":
			chartFiles[rel] = data
		}
		return nil
	})
	if err != nil {
		return err
	}

	top := map[string]interface{}{
		"Values": vals,
		"Chart":  meta,
		"Files":  chartFiles,
		"Release": map[string]interface{}{"Name": name, "Namespace": *namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1},
		"Capabilities": capabilities{
			KubeVersion: kubeVer{Version: kubeVersion, Major: "1", Minor: strings.Split(kubeVersion, ".")[1]},
			APIVersions: append(versionSet(apiVersions), extraAPIs...),
			HelmVersion: map[string]string{"Version": "v3.18.0"},
		},
	}

	t := template.New("gotpl").Option("missingkey=zero")
	addFuncs(t)
	names := make([]string, 0, len(tpls))
	for n := range tpls {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := t.New(n).Parse(tpls[n]); err != nil {
			return err
		}
	}

	type manifest struct {
		source, text, kind string
		hook               bool
	}
	var out []manifest
	for _, n := range names {
		if strings.HasPrefix(path.Base(n), "_") {
			continue
		}
		top["Template"] = map[string]interface{}{"Name": n, "BasePath": path.Join(meta.Name, "templates")}
		var b strings.Builder
		if err := t.ExecuteTemplate(&b, n, top); err != nil {
			return execError(err)
		}
		if path.Base(n) == "NOTES.txt" {
			continue
		}
		// releaseutil.SplitManifests, then a parse of each document's head, as Helm's sorter does
		for _, doc := range docSep.Split(strings.TrimSpace(strings.ReplaceAll(b.String(), "<no value>", "")), -1) {
			if doc = strings.TrimSpace(doc); doc == "" {
				continue
			}
			var head struct {
				Kind     string
				Metadata struct{ Annotations map[string]string }
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return fmt.Errorf("YAML parse error on %s: %v", n, err)
			}
			_, hook := head.Metadata.Annotations["helm.sh/hook"]
			out = append(out, manifest{n, doc, head.Kind, hook})
		}
	}

	rank := func(kind string) int {
		for i, k := range installOrder {
			if k == kind {
				return i
			}
		}
		return len(installOrder)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.hook != b.hook {
			return b.hook
		}
		if ra, rb := rank(a.kind), rank(b.kind); ra != rb {
			return ra < rb
		}
		return rank(a.kind) == len(installOrder) && a.kind < b.kind
	})
	for _, m := range out {
		fmt.Printf("---\n# Source: %s\n%s\n", m.source, m.text)
	}
	return nil
}

// addFuncs gives t sprig's functions and Helm's own. It is called again on tpl's clones, so that
// their include sees the templates tpl defines.
func addFuncs(t *template.Template) {
	f := sprig.TxtFuncMap()
	delete(f, "env") // Helm removes these: a chart must not read the machine rendering it
	delete(f, "expandenv")
	f["toYaml"] = func(v interface{}) string {
		// Helm's sigs.k8s.io/yaml goes through JSON: keys sorted, numbers as JSON writes them
		j, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		var n yaml.Node
		if err := yaml.Unmarshal(j, &n); err != nil {
			return ""
		}
		blockStyle(&n)
		var b strings.Builder
		e := yaml.NewEncoder(&b)
		e.SetIndent(2)
		if err := e.Encode(&n); err != nil {
			return ""
		}
		return strings.TrimSuffix(b.String(), "\n")
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := decodeLikeHelm([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["toJson"] = func(v interface{}) string {
		j, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(j)
	}
	f["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if s, ok := v.(string); v == nil || ok && s == "" {
			return v, errors.New(msg)
		}
		return v, nil
	}
	// No cluster to ask: helm template's lookup finds nothing too.
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	f["include"] = func(name string, data interface{}) (string, error) {
		var b strings.Builder
		err := t.ExecuteTemplate(&b, name, data)
		return b.String(), err
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		c, err := t.Clone()
		if err != nil {
			return "", err
		}
		addFuncs(c)
		if _, err := c.New("tpl").Parse(text); err != nil {
			return "", err
		}
		var b strings.Builder
		err = c.ExecuteTemplate(&b, "tpl", data)
		return strings.ReplaceAll(b.String(), "<no value>", ""), err
	}
	t.Funcs(f)
}

// blockStyle drops the JSON's flow style and quotes: the encoder then writes block YAML and quotes
// only the strings that need it, as sigs.k8s.io/yaml does.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

var execErr = regexp.MustCompile(`(?s)^template: (\S+?): executing ".*?" at <.*?>: error calling \w+: (.*)$`)

// execError shortens text/template's error the way Helm does, so that `required` and `fail` read
// as their message: "execution error at (jetgate/templates/secret.yaml:12:5): message", at the
// innermost template when the error came through include.
func execError(err error) error {
	at, msg := "", err.Error()
	for m := execErr.FindStringSubmatch(msg); m != nil; m = execErr.FindStringSubmatch(msg) {
		at, msg = m[1], m[2]
	}
	if at == "" {
		return err
	}
	return fmt.Errorf("execution error at (%s): %s", at, msg)
}

func readYAML(file string, v interface{}) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %v", file, err)
	}
	return nil
}

func readValues(file string, v *map[string]interface{}) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := decodeLikeHelm(data, v); err != nil {
		return fmt.Errorf("%s: %v", file, err)
	}
	if *v == nil {
		*v = map[string]interface{}{}
	}
	return nil
}

// decodeLikeHelm decodes YAML through JSON, as sigs.k8s.io/yaml does for Helm: every number is a
// float64, so templates see exactly the types they would under helm (`1e+06` and all).
func decodeLikeHelm(data []byte, v interface{}) error {
	var raw interface{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return err
	}
	j, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	return json.Unmarshal(j, v)
}

// coalesce merges over into base as Helm does: maps deep-merged, anything else replaced, null deletes.
func coalesce(base, over map[string]interface{}) map[string]interface{} {
	for k, v := range over {
		if v == nil {
			delete(base, k)
			continue
		}
		if om, ok := v.(map[string]interface{}); ok {
			if bm, ok := base[k].(map[string]interface{}); ok {
				base[k] = coalesce(bm, om)
				continue
			}
		}
		base[k] = v
	}
	return base
}
