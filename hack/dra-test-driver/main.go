// dra-test-driver: a TEST DOUBLE for NVIDIA's DRA driver for GPUs (github.com/NVIDIA/k8s-dra-driver-gpu,
// its gpu-kubelet-plugin), for a node that has no GPU.
//
// It is a real kubelet plugin (k8s.io/dynamic-resource-allocation/kubeletplugin): it registers with
// the kubelet through <plugin-registration-path>/<driver>-reg.sock, serves the DRA gRPC API on
// <datadir>/dra.sock, and publishes one ResourceSlice pool, named after the node, with the GPUs and
// MIG devices of a NodeGPUInventory file (the format tests/harness/fake_device_plugin.py and the
// node agent use). Devices are named and described as NVIDIA's driver does (v25.8,
// cmd/gpu-kubelet-plugin/deviceinfo.go), so claims and DeviceClasses written for that driver select
// them unchanged:
//
//   - a GPU without MIG: "gpu-<index>", attributes type=gpu, uuid, productName, brand, architecture,
//     cudaComputeCapability, driverVersion, cudaDriverVersion, pcieBusID; capacity memory (bytes);
//   - each MIG device of a GPU with MIG: "gpu-<index>-mig-<giProfileId>-<start>-<size>", attributes
//     type=mig, uuid, parentUUID, profile and the parent's productName, brand, architecture and
//     versions; capacity memory (and multiprocessors when the inventory has them).
//
// Unhealthy GPUs and MIG devices are not published (the fake device plugin skips them too). The
// inventory says nothing of GPU instance profile ids and placements; they are derived from the
// profile name as on the A100/H100/H200 family (8 memory slices; see migPlacements), which gives the
// names the real driver gives there ("gpu-0-mig-9-0-4" and "gpu-0-mig-9-4-4" for two 3g.40gb).
// tests/harness/dra_driver.py slice_of() computes the same slice in Python for nodes without a
// kubelet; a test compares the two.
//
// NodePrepareResources writes, per claim, a CDI spec file <cdi-dir>/k8s.<driver>-claim_<claim
// UID>.json whose devices are "<claim UID>-<device>" of kind k8s.<driver>/claim (the real driver's
// naming), with NVIDIA_VISIBLE_DEVICES=<the claim's GPU/MIG UUIDs> in its containerEdits; there is
// no device node to mount. NodeUnprepareResources removes the file.
//
//	dra-test-driver --inventory inv.json --node-name node-0 --kubeconfig admin.kubeconfig
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const (
	defaultDriverVersion     = "550.54.15"
	defaultCUDADriverVersion = "12.4"
	cdiVersion               = "0.5.0"
	cdiClass                 = "claim"
)

// ---- the inventory (the fields this double reads) ----------------------------------------------

type migDevice struct {
	UUID            string `json:"uuid"`
	Profile         string `json:"profile"`
	MemoryMiB       int64  `json:"memoryMiB"`
	Multiprocessors *int64 `json:"multiprocessors"`
	Healthy         *bool  `json:"healthy"`
}

type gpu struct {
	Index             int         `json:"index"`
	UUID              string      `json:"uuid"`
	Vendor            string      `json:"vendor"`
	Name              string      `json:"name"`
	MemoryMiB         int64       `json:"memoryMiB"`
	PCIBusID          string      `json:"pciBusId"`
	ComputeCapability string      `json:"computeCapability"`
	Healthy           *bool       `json:"healthy"`
	MIGEnabled        bool        `json:"migEnabled"`
	MIGDevices        []migDevice `json:"migDevices"`
}

type inventory struct {
	DriverVersion     string `json:"driverVersion"`
	CUDADriverVersion string `json:"cudaDriverVersion"`
	GPUs              []gpu  `json:"gpus"`
}

func healthy(h *bool) bool { return h == nil || *h }

// ---- devices, as NVIDIA's driver describes them --------------------------------------------------

// architecture is what NVML's nvmlDeviceGetArchitecture names (go-nvlib GetArchitectureAsString),
// derived from the compute capability; "" when unknown (the attribute is then left out).
func architecture(cc string) string {
	major, minor, ok := strings.Cut(cc, ".")
	if !ok {
		return ""
	}
	switch major {
	case "3":
		return "Kepler"
	case "5":
		return "Maxwell"
	case "6":
		return "Pascal"
	case "7":
		if minor == "5" {
			return "Turing"
		}
		return "Volta"
	case "8":
		if minor == "9" {
			return "Ada Lovelace"
		}
		return "Ampere"
	case "9":
		return "Hopper"
	case "10", "11", "12":
		return "Blackwell"
	}
	return ""
}

// brand is what NVML's nvmlDeviceGetBrand names (go-nvlib GetBrandAsString): "GeForce" for GeForce
// cards, "Nvidia" (NVML_BRAND_NVIDIA) for the data-center GPUs of recent generations.
func brand(productName string) string {
	if strings.Contains(productName, "GeForce") {
		return "GeForce"
	}
	return "Nvidia"
}

var numeric = regexp.MustCompile(`^\d+$`)

// semver turns "8.0", "12.8" or "535.104.05" into strict semver ("8.0.0", "12.8.0", "535.104.5"),
// as the driver does with Masterminds/semver; "" when it is not a dotted number.
func semver(v string) string {
	parts := strings.Split(strings.TrimSpace(v), ".")
	if len(parts) == 0 || len(parts) > 3 {
		return ""
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		if !numeric.MatchString(p) {
			return ""
		}
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return ""
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, ".")
}

// pcieBusID is NVML's bus id as go-nvlib GetPCIBusID returns it: lower case, a 32-bit domain
// ("00000000:3D:00.0") shortened to 16 bits ("0000:3d:00.0").
func pcieBusID(id string) string {
	id = strings.ToLower(id)
	if id != "0000" {
		id = strings.TrimPrefix(id, "0000")
	}
	return id
}

var profileName = regexp.MustCompile(`^(\d+)g\.(\d+)gb(\+me)?`)

// migPlacement is a MIG device's GPU instance profile id and placement (start, size in memory slices).
type migPlacement struct{ profileID, start, size int }

// giProfileIDs: nvidia-smi mig -lgip's ids on the 8-memory-slice GPUs (A100, H100, H200), by
// (compute slices, memory slices); "+me" variants of 1g are id 20.
var giProfileIDs = map[[2]int]int{{1, 1}: 19, {1, 2}: 15, {2, 2}: 14, {3, 4}: 9, {4, 4}: 5, {7, 8}: 0}

// migPlacements places a GPU's MIG devices first-fit on its 8 memory slices, each at a start that
// is a multiple of its size, in inventory order, as a mig-parted layout of those profiles would.
// A profile it cannot read gets an id of 100 + its position and is placed after the others.
func migPlacements(parentMiB int64, devices []migDevice) []migPlacement {
	out := make([]migPlacement, len(devices))
	used := make([]bool, 64)
	next := 8
	for i, m := range devices {
		g := profileName.FindStringSubmatch(m.Profile)
		if g == nil || parentMiB <= 0 {
			out[i] = migPlacement{100 + i, next, 1}
			next++
			continue
		}
		compute, _ := strconv.Atoi(g[1])
		gb, _ := strconv.Atoi(g[2])
		size := nearestSlices(float64(gb) * 8 / (float64(parentMiB) / 1024))
		id, known := giProfileIDs[[2]int{compute, size}]
		if g[3] != "" && compute == 1 {
			id, known = 20, true
		}
		if !known {
			id = 100 + i
		}
		start := -1
		for s := 0; s+size <= 8 && start < 0; s += size {
			free := true
			for k := s; k < s+size; k++ {
				free = free && !used[k]
			}
			if free {
				start = s
			}
		}
		if start < 0 {
			start, next = next, next+size
		}
		for k := start; k < start+size && k < len(used); k++ {
			used[k] = true
		}
		out[i] = migPlacement{id, start, size}
	}
	return out
}

func nearestSlices(x float64) int {
	best := 1
	for _, s := range []int{1, 2, 4, 8} {
		if abs(x-float64(s)) < abs(x-float64(best)) {
			best = s
		}
	}
	return best
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func ver(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &s} }

func mib(n int64) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(n*1024*1024, resource.BinarySI)}
}

// published is one device of the slice and the UUID that NodePrepareResources hands out for it.
type published struct {
	device resourceapi.Device
	uuid   string
}

// devicesOf returns the devices of the inventory in the order they are published.
func devicesOf(inv inventory) []published {
	driverVersion := semver(inv.DriverVersion)
	if driverVersion == "" {
		driverVersion = semver(defaultDriverVersion)
	}
	cudaVersion := semver(inv.CUDADriverVersion)
	if cudaVersion == "" {
		cudaVersion = semver(defaultCUDADriverVersion)
	}
	var out []published
	for _, g := range inv.GPUs {
		if (g.Vendor != "" && g.Vendor != "nvidia") || !healthy(g.Healthy) {
			continue
		}
		common := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"productName":       str(g.Name),
			"brand":             str(brand(g.Name)),
			"driverVersion":     ver(driverVersion),
			"cudaDriverVersion": ver(cudaVersion),
		}
		if a := architecture(g.ComputeCapability); a != "" {
			common["architecture"] = str(a)
		}
		if cc := semver(g.ComputeCapability); cc != "" {
			common["cudaComputeCapability"] = ver(cc)
		}
		if g.PCIBusID != "" {
			common["pcieBusID"] = str(pcieBusID(g.PCIBusID))
		}
		if !g.MIGEnabled {
			attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu"), "uuid": str(g.UUID)}
			for k, v := range common {
				attrs[k] = v
			}
			out = append(out, published{resourceapi.Device{
				Name:       fmt.Sprintf("gpu-%d", g.Index),
				Attributes: attrs,
				Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": mib(g.MemoryMiB)},
			}, g.UUID})
			continue
		}
		placements := migPlacements(g.MemoryMiB, g.MIGDevices)
		for i, m := range g.MIGDevices {
			if !healthy(m.Healthy) {
				continue
			}
			attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": str("mig"), "uuid": str(m.UUID), "parentUUID": str(g.UUID), "profile": str(m.Profile),
			}
			for k, v := range common {
				attrs[k] = v
			}
			capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": mib(m.MemoryMiB)}
			if m.Multiprocessors != nil {
				capacity["multiprocessors"] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(*m.Multiprocessors, resource.BinarySI)}
			}
			p := placements[i]
			out = append(out, published{resourceapi.Device{
				Name:       fmt.Sprintf("gpu-%d-mig-%d-%d-%d", g.Index, p.profileID, p.start, p.size),
				Attributes: attrs,
				Capacity:   capacity,
			}, m.UUID})
		}
	}
	return out
}

// ---- the kubelet plugin ----------------------------------------------------------------------------

type driver struct {
	name, node, cdiDir string
	uuids              map[string]string // device name -> GPU or MIG UUID
	cancel             context.CancelCauseFunc
	mu                 sync.Mutex
}

func (d *driver) cdiKind() string { return "k8s." + d.name + "/" + cdiClass }

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("k8s.%s-%s_%s.json", d.name, cdiClass, uid))
}

type cdiEdits struct {
	Env []string `json:"env,omitempty"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiSpec struct {
	Version        string      `json:"cdiVersion"`
	Kind           string      `json:"kind"`
	ContainerEdits cdiEdits    `json:"containerEdits"`
	Devices        []cdiDevice `json:"devices"`
}

var notEnvChar = regexp.MustCompile(`[^A-Za-z0-9_]`)

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.prepare(ctx, claim)
	}
	return out, nil
}

func (d *driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	spec := cdiSpec{Version: cdiVersion, Kind: d.cdiKind()}
	var result kubeletplugin.PrepareResult
	var uuids []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name || r.Pool != d.node {
			continue
		}
		uuid, ok := d.uuids[r.Device]
		if !ok {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: device %s is not in pool %s", claim.Namespace, claim.Name, r.Device, d.node)}
		}
		name := fmt.Sprintf("%s-%s", claim.UID, r.Device)
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, ContainerEdits: cdiEdits{
			Env: []string{fmt.Sprintf("DRA_DEVICE_%s=%s", strings.ToUpper(notEnvChar.ReplaceAllString(r.Device, "_")), uuid)},
		}})
		uuids = append(uuids, uuid)
		result.Devices = append(result.Devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{d.cdiKind() + "=" + name},
		})
	}
	if len(spec.Devices) > 0 {
		spec.ContainerEdits.Env = []string{"NVIDIA_VISIBLE_DEVICES=" + strings.Join(uuids, ",")}
		if err := writeFileAtomic(d.specPath(claim.UID), spec); err != nil {
			return kubeletplugin.PrepareResult{Err: err}
		}
	}
	klog.FromContext(ctx).Info("prepared", "claim", klog.KObj(claim), "uid", claim.UID, "uuids", uuids)
	return result
}

func writeFileAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		out[c.UID] = err
		klog.FromContext(ctx).Info("unprepared", "claim", c.NamespacedName, "uid", c.UID)
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("%s: %w", msg, err))
	}
}

func main() {
	var (
		inventoryPath = flag.String("inventory", "", "NodeGPUInventory JSON file (required)")
		nodeName      = flag.String("node-name", os.Getenv("NODE_NAME"), "the node this plugin runs on; also the pool's name")
		driverName    = flag.String("driver-name", "gpu.nvidia.com", "DRA driver name")
		kubeconfig    = flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig that may write ResourceSlices and read ResourceClaims")
		cdiDir        = flag.String("cdi-dir", "/var/run/cdi", "where CDI spec files are written")
		registryDir   = flag.String("plugin-registration-path", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
		dataDir       = flag.String("datadir", "", "directory of the plugin's dra.sock (default "+kubeletplugin.KubeletPluginsDir+"/<driver-name>)")
		printSlice    = flag.Bool("print-slice", false, "print the ResourceSlice spec it would publish (JSON) and exit")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *inventoryPath == "" || *nodeName == "" {
		fmt.Fprintln(os.Stderr, "--inventory and --node-name are required")
		os.Exit(2)
	}
	if *printSlice {
		if err := printSpec(*inventoryPath, *nodeName, *driverName); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(*inventoryPath, *nodeName, *driverName, *kubeconfig, *cdiDir, *registryDir, *dataDir); err != nil {
		klog.ErrorS(err, "dra-test-driver failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func readInventory(path string) (inventory, error) {
	var inv inventory
	raw, err := os.ReadFile(path)
	if err != nil {
		return inv, err
	}
	if err := json.Unmarshal(raw, &inv); err != nil {
		return inv, fmt.Errorf("%s: %w", path, err)
	}
	return inv, nil
}

// printSpec prints the spec of the slice the plugin publishes, as the apiserver stores it (the
// ResourceSlice controller sets the pool's generation to 1 and its slice count to 1 here).
func printSpec(inventoryPath, nodeName, driverName string) error {
	inv, err := readInventory(inventoryPath)
	if err != nil {
		return err
	}
	spec := resourceapi.ResourceSliceSpec{
		Driver:   driverName,
		Pool:     resourceapi.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
		NodeName: &nodeName,
		Devices:  []resourceapi.Device{},
	}
	for _, p := range devicesOf(inv) {
		spec.Devices = append(spec.Devices, p.device)
	}
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(out))
	return err
}

func run(inventoryPath, nodeName, driverName, kubeconfig, cdiDir, registryDir, dataDir string) error {
	inv, err := readInventory(inventoryPath)
	if err != nil {
		return err
	}
	devices := devicesOf(inv)
	if dataDir == "" {
		dataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, driverName)
	}
	for _, dir := range []string{dataDir, registryDir, cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	d := &driver{name: driverName, node: nodeName, cdiDir: cdiDir, uuids: map[string]string{}, cancel: cancel}
	var slice []resourceapi.Device
	for _, p := range devices {
		d.uuids[p.device.Name] = p.uuid
		slice = append(slice, p.device)
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: []resourceslice.Slice{{Devices: slice}}}},
	}); err != nil {
		return err
	}
	names := make([]string, 0, len(slice))
	for _, dev := range slice {
		names = append(names, dev.Name)
	}
	sort.Strings(names)
	logger.Info("publishing", "driver", driverName, "pool", nodeName, "devices", names)

	// The harness waits for this line: the kubelet called back with the result of registration.
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if s := helper.RegistrationStatus(); s != nil {
				if s.PluginRegistered {
					logger.Info("registered with the kubelet")
				} else {
					logger.Info("the kubelet refused the registration", "error", s.Error)
				}
				return
			}
		}
	}()

	<-ctx.Done()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	logger.Info("stopping")
	return nil
}
