// Command flux-ssa-bench applies object sets with Flux's server-side apply engine
// (github.com/fluxcd/pkg/ssa, the engine behind kustomize-controller) so that
// examples/apply_bench.rs can time it against fleetgate's engine on the same API server.
//
// It is a long-lived process, like a controller: the client, its REST mapper and the
// status poller are built once and stay warm across runs. Each line on stdin is one run:
//
//	apply DIR [wait]
//
// reads every *.yaml file in DIR (multi-document), and does what kustomize-controller's
// reconcile does with them: owner labels, ApplyAllStaged (which waits for CRDs and Namespaces
// with WaitForSet), with `wait` (a Kustomization's spec.wait, default false) WaitForSet on the
// whole change set, then garbage collection of what the previous run's inventory held and this one does
// not (DeleteAll, restricted to objects carrying the owner labels). The inventory is kept
// in memory (kustomize-controller keeps it in the Kustomization's status; that status
// write is one request this program does not make). One JSON line per run goes to stdout:
// wall time, the requests this process sent (counted by a transport wrapper) and the
// change set's actions.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	"github.com/fluxcd/pkg/ssa/utils"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// counter is an http.RoundTripper that counts every request the client sends.
type counter struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

type result struct {
	Ms       float64        `json:"ms"`
	Requests int64          `json:"requests"`
	Actions  map[string]int `json:"actions"`
	Error    string         `json:"error,omitempty"`
}

func readObjects(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var objects []*unstructured.Unstructured
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		objs, err := utils.ReadObjects(fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		objects = append(objects, objs...)
	}
	return objects, nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the target API server")
	concurrency := flag.Int("concurrency", 16, "ResourceManager concurrency (the bench passes fleetgate's default, 16, so the engines are compared, not their settings)")
	waitInterval := flag.Duration("wait-interval", 2*time.Second, "status poll interval (kustomize-controller uses 2s)")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// No client-side throttling: fleetgate's client has none either, and the count is what matters.
	cfg.QPS = 1e6
	cfg.Burst = 1e6
	count := &counter{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { count.next = rt; return count }
	kube, err := client.New(cfg, client.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	poller := polling.NewStatusPoller(kube, kube.RESTMapper(), polling.Options{})
	owner := ssa.Owner{Field: "kustomize-controller", Group: "kustomize.toolkit.fluxcd.io"}
	manager := ssa.NewResourceManager(kube, poller, owner)
	manager.SetConcurrency(*concurrency)

	var inventory []*unstructured.Unstructured
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) < 2 || len(fields) > 3 || fields[0] != "apply" || (len(fields) == 3 && fields[2] != "wait") {
			out.Encode(result{Error: "expected: apply DIR [wait]"})
			continue
		}
		before := count.n.Load()
		start := time.Now()
		res := result{Actions: map[string]int{}}
		next, err := run(manager, fields[1], len(fields) == 3, inventory, *waitInterval, res.Actions)
		res.Ms = float64(time.Since(start).Microseconds()) / 1000
		res.Requests = count.n.Load() - before
		if err != nil {
			res.Error = err.Error()
		} else {
			inventory = next
		}
		out.Encode(res)
	}
}

// run is one reconcile: apply in stages, wait, prune what left the set.
func run(manager *ssa.ResourceManager, dir string, waitAll bool, inventory []*unstructured.Unstructured,
	waitInterval time.Duration, actions map[string]int) ([]*unstructured.Unstructured, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	objects, err := readObjects(dir)
	if err != nil {
		return nil, err
	}
	manager.SetOwnerLabels(objects, "bench", "flux-system")
	opts := ssa.DefaultApplyOptions()
	opts.WaitInterval = waitInterval
	opts.WaitTimeout = 2 * time.Minute
	changeSet, err := manager.ApplyAllStaged(ctx, objects, opts)
	if err != nil {
		return nil, err
	}
	for _, e := range changeSet.Entries {
		actions[string(e.Action)]++
	}
	if waitAll {
		if err := manager.WaitForSet(changeSet.ToObjMetadataSet(),
			ssa.WaitOptions{Interval: waitInterval, Timeout: 2 * time.Minute}); err != nil {
			return nil, err
		}
	}
	keep := object.UnstructuredSetToObjMetadataSet(objects)
	var stale []*unstructured.Unstructured
	for _, o := range inventory {
		if !keep.Contains(object.UnstructuredToObjMetadata(o)) {
			stale = append(stale, o)
		}
	}
	if len(stale) > 0 {
		deleteOpts := ssa.DefaultDeleteOptions()
		deleteOpts.Inclusions = manager.GetOwnerLabels("bench", "flux-system")
		deleted, err := manager.DeleteAll(ctx, stale, deleteOpts)
		if err != nil {
			return nil, err
		}
		for _, e := range deleted.Entries {
			actions[string(e.Action)]++
		}
	}
	return objects, nil
}
