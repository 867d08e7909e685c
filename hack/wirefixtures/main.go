// Command wirefixtures writes kube-scheduler extender messages encoded by the upstream Go types
// (k8s.io/kube-scheduler/extender/v1 with encoding/json, exactly as kube-scheduler's HTTPExtender
// sends and decodes them) into tests/fixtures/wire/, so the Python wire tests check against the
// real encoding rather than a hand-written guess.
//
//	cd hack/wirefixtures && go run . ../../tests/fixtures/wire
package main

import (
	"encoding/json"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func write(dir, name string, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
		panic(err)
	}
}

func main() {
	dir := os.Args[1]
	pod := &v1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "llm-13b-inference", Namespace: "default", UID: "0b6c8c4e-6d2a-4a8e-9d51-1f0f3c0f0001",
			Annotations: map[string]string{
				"gpuplace.io/model-params": "13B",
				"gpuplace.io/workload":     "inference",
				"gpuplace.io/precision":    "bf16",
			},
		},
		Spec: v1.PodSpec{
			SchedulerName: "gpuplace-scheduler",
			Containers: []v1.Container{{
				Name: "server", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{
					Limits:   v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
					Requests: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), v1.ResourceCPU: resource.MustParse("100m")},
				},
			}},
		},
	}
	names := []string{"gpu-4090-0", "gpu-a6000-0", "gpu-a100-mig-0"}
	write(dir, "filter_args_nodecache.json", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})

	inv, err := os.ReadFile(filepath.Join(dir, "..", "..", "..", "examples", "cluster", "gpu-4090-0.json"))
	if err != nil {
		panic(err)
	}
	var compact map[string]any
	if err := json.Unmarshal(inv, &compact); err != nil {
		panic(err)
	}
	invJSON, _ := json.Marshal(compact)
	nodes := &v1.NodeList{Items: []v1.Node{{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-4090-0", Annotations: map[string]string{"gpuplace.io/inventory": string(invJSON)}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("4"), v1.ResourcePods: resource.MustParse("110")}},
	}}}
	write(dir, "filter_args_nodelist.json", extenderv1.ExtenderArgs{Pod: pod, Nodes: nodes})

	passing := []string{"gpu-a6000-0"}
	write(dir, "filter_result.json", extenderv1.ExtenderFilterResult{
		NodeNames:                  &passing,
		FailedNodes:                extenderv1.FailedNodesMap{"gpu-a100-mig-0": "1 of 4 eligible MIG devices free"},
		FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"gpu-4090-0": "GPU 0-3: 24 GiB VRAM < 30.3 GiB needed (13B inference, bf16)"},
	})
	write(dir, "prioritize_result.json", extenderv1.HostPriorityList{{Host: "gpu-a6000-0", Score: 7}})
}
