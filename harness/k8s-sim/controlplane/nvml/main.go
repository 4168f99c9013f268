// Command nvml is libnvidia-ml.so.1 for a test node without a GPU: NVML's C ABI
// (the functions NVIDIA's k8s-device-plugin v0.18.1, its GPU feature discovery and
// go-nvlib call, with nvml.h's signatures) answered by NVIDIA's own mock NVML server
// (github.com/NVIDIA/go-nvml pkg/nvml/mock/server, with its gpus.H100_SXM5_80GB and
// gpus.H200_SXM5_141GB shapes). The glue is ours; what each GPU says is the mock's.
//
// Built with -buildmode=c-shared. It reads nvml-mock.json beside itself (found through
// /proc/self/maps): the node's name, which makes the GPUs' UUIDs the same in every
// process that loads the library, and its GPUs' models. Handles given to callers are
// small integers, never pointers into this library's memory. Functions a GPU's model
// does not support answer NVML_ERROR_NOT_SUPPORTED, as a driver does.
package main

/*
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef void *nvmlEventSet_t;

// nvml.h's nvmlPciInfo_t (the _v3 layout, which _v2 shares).
typedef struct {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

// nvml.h's nvmlMemory_t.
typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

// nvml.h's nvmlEventData_t.
typedef struct {
	nvmlDevice_t device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlEventData_t;
*/
import "C"

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// config is nvml-mock.json.
type config struct {
	// Node names the node; UUIDs derive from it and the GPU's index.
	Node string `json:"node"`
	// GPUs lists each GPU's model: "H100_SXM5_80GB" or "H200_SXM5_141GB".
	GPUs []string `json:"gpus"`
}

// models are the mock's GPU shapes by name.
var models = map[string]gpus.Config{
	"H100_SXM5_80GB":  gpus.H100_SXM5_80GB,
	"H200_SXM5_141GB": gpus.H200_SXM5_141GB,
}

var (
	once    sync.Once
	mock    *server.Server
	loadErr error
	mu      sync.Mutex
	inits   int
	strs    = map[nvml.Return]*C.char{}
)

// load builds the mock server from nvml-mock.json beside this library.
func load() {
	path, err := configPath()
	if err != nil {
		loadErr = err
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		loadErr = err
		return
	}
	var c config
	if err := json.Unmarshal(data, &c); err != nil {
		loadErr = fmt.Errorf("%s: %w", path, err)
		return
	}
	var shapes []gpus.Config
	for _, m := range c.GPUs {
		g, ok := models[m]
		if !ok {
			loadErr = fmt.Errorf("%s: unknown GPU model %q", path, m)
			return
		}
		shapes = append(shapes, g)
	}
	// The driver and CUDA versions of the mock's own DGX servers (go-nvml
	// pkg/nvml/mock/dgxh100).
	mock = server.NewServerWithGPUs("550.54.15", "12.550.54.15", 12040, shapes...)
	for i, d := range mock.Devices {
		dev := d.(*server.Device)
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", c.Node, i)))
		h := fmt.Sprintf("%x", sum[:16])
		dev.UUID = fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
		dev.PciBusID = fmt.Sprintf("00000000:%02X:00.0", 0x18+i)
	}
}

// configPath is nvml-mock.json in the directory this library was loaded from.
func configPath() (string, error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && strings.HasSuffix(f[5], "/libnvidia-ml.so.1") {
			return filepath.Join(filepath.Dir(f[5]), "nvml-mock.json"), nil
		}
	}
	return "", fmt.Errorf("libnvidia-ml.so.1 is not in /proc/self/maps")
}

func ret(r nvml.Return) C.nvmlReturn_t { return C.nvmlReturn_t(r) }

// device is the mock's device for a handle (index + 1).
func device(h C.nvmlDevice_t) (*server.Device, nvml.Return) {
	if mock == nil {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	i := int(uintptr(h)) - 1
	if i < 0 || i >= len(mock.Devices) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return mock.Devices[i].(*server.Device), nvml.SUCCESS
}

func handle(i int) C.nvmlDevice_t { return C.nvmlDevice_t(unsafe.Pointer(uintptr(i + 1))) }

// copyString writes s into buf of length n, NUL-terminated.
func copyString(s string, buf *C.char, n C.uint) C.nvmlReturn_t {
	if buf == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if len(s)+1 > int(n) {
		return ret(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	copy(out, s)
	out[len(s)] = 0
	return ret(nvml.SUCCESS)
}

//export nvmlInit_v2
func nvmlInit_v2() C.nvmlReturn_t {
	once.Do(load)
	if loadErr != nil {
		fmt.Fprintf(os.Stderr, "libnvidia-ml (mock): %v\n", loadErr)
		return ret(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	mu.Lock()
	inits++
	mu.Unlock()
	return ret(nvml.SUCCESS)
}

//export nvmlInit
func nvmlInit() C.nvmlReturn_t { return nvmlInit_v2() }

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.nvmlReturn_t { return nvmlInit_v2() }

//export nvmlShutdown
func nvmlShutdown() C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if inits == 0 {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	inits--
	return ret(nvml.SUCCESS)
}

//export nvmlErrorString
func nvmlErrorString(r C.nvmlReturn_t) *C.char {
	mu.Lock()
	defer mu.Unlock()
	k := nvml.Return(r)
	if s, ok := strs[k]; ok {
		return s
	}
	text, ok := errorText[k]
	if !ok {
		text = "Unknown Error"
	}
	s := C.CString(text)
	strs[k] = s
	return s
}

// errorText is NVML's text for the codes this library returns (nvml.h's comments).
var errorText = map[nvml.Return]string{
	nvml.SUCCESS:                  "Success",
	nvml.ERROR_UNINITIALIZED:      "Uninitialized",
	nvml.ERROR_INVALID_ARGUMENT:   "Invalid Argument",
	nvml.ERROR_NOT_SUPPORTED:      "Not Supported",
	nvml.ERROR_NOT_FOUND:          "Not Found",
	nvml.ERROR_INSUFFICIENT_SIZE:  "Insufficient Size",
	nvml.ERROR_DRIVER_NOT_LOADED:  "Driver Not Loaded",
	nvml.ERROR_TIMEOUT:            "Timeout",
	nvml.ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(buf *C.char, n C.uint) C.nvmlReturn_t {
	if mock == nil {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	v, r := mock.SystemGetDriverVersion()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return copyString(v, buf, n)
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(buf *C.char, n C.uint) C.nvmlReturn_t {
	if mock == nil {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	v, r := mock.SystemGetNVMLVersion()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return copyString(v, buf, n)
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(v *C.int) C.nvmlReturn_t {
	if mock == nil {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	c, r := mock.SystemGetCudaDriverVersion()
	*v = C.int(c)
	return ret(r)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(v *C.int) C.nvmlReturn_t {
	return nvmlSystemGetCudaDriverVersion(v)
}

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(n *C.uint) C.nvmlReturn_t {
	if mock == nil {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	c, r := mock.DeviceGetCount()
	*n = C.uint(c)
	return ret(r)
}

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(n *C.uint) C.nvmlReturn_t { return nvmlDeviceGetCount_v2(n) }

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(i C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	if mock == nil {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	if int(i) >= len(mock.Devices) {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*out = handle(int(i))
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(i C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	return nvmlDeviceGetHandleByIndex_v2(i, out)
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, out *C.nvmlDevice_t) C.nvmlReturn_t {
	if mock == nil {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	want := C.GoString(uuid)
	for i, d := range mock.Devices {
		if d.(*server.Device).UUID == want {
			*out = handle(i)
			return ret(nvml.SUCCESS)
		}
	}
	return ret(nvml.ERROR_NOT_FOUND)
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(h C.nvmlDevice_t, buf *C.char, n C.uint) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	v, r := d.GetName()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return copyString(v, buf, n)
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(h C.nvmlDevice_t, buf *C.char, n C.uint) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	v, r := d.GetUUID()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return copyString(v, buf, n)
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(h C.nvmlDevice_t, v *C.uint) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	m, r := d.GetMinorNumber()
	*v = C.uint(m)
	return ret(r)
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(h C.nvmlDevice_t, v *C.uint) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	m, r := d.GetIndex()
	*v = C.uint(m)
	return ret(r)
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(h C.nvmlDevice_t, p *C.nvmlPciInfo_t) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	info, r := d.GetPciInfo()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	C.memset(unsafe.Pointer(p), 0, C.sizeof_nvmlPciInfo_t)
	var domain, bus, dev uint
	fmt.Sscanf(d.PciBusID, "%08X:%02X:%02X", &domain, &bus, &dev)
	p.domain, p.bus, p.device = C.uint(domain), C.uint(bus), C.uint(dev)
	p.pciDeviceId = C.uint(info.PciDeviceId)
	legacy := d.PciBusID[4:]
	copyString(legacy, &p.busIdLegacy[0], 16)
	copyString(d.PciBusID, &p.busId[0], 32)
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetPciInfo_v2
func nvmlDeviceGetPciInfo_v2(h C.nvmlDevice_t, p *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return nvmlDeviceGetPciInfo_v3(h, p)
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(h C.nvmlDevice_t, m *C.nvmlMemory_t) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	info, r := d.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	m.total, m.free, m.used = C.ulonglong(info.Total), C.ulonglong(info.Total-info.Used), C.ulonglong(info.Used)
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(h C.nvmlDevice_t, major, minor *C.int) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	a, b, r := d.GetCudaComputeCapability()
	*major, *minor = C.int(a), C.int(b)
	return ret(r)
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(h C.nvmlDevice_t, v *C.int) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	b, r := d.GetBrand()
	*v = C.int(b)
	return ret(r)
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(h C.nvmlDevice_t, v *C.uint) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	a, r := d.GetArchitecture()
	*v = C.uint(a)
	return ret(r)
}

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(h C.nvmlDevice_t, current, pending *C.uint) C.nvmlReturn_t {
	d, r := device(h)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if len(d.Config.MIGProfiles.GpuInstanceProfiles) == 0 {
		return ret(nvml.ERROR_NOT_SUPPORTED)
	}
	c, p, r := d.GetMigMode()
	*current, *pending = C.uint(c), C.uint(p)
	return ret(r)
}

//export nvmlDeviceGetTopologyCommonAncestor
func nvmlDeviceGetTopologyCommonAncestor(a, b C.nvmlDevice_t, level *C.int) C.nvmlReturn_t {
	if _, r := device(a); r != nvml.SUCCESS {
		return ret(r)
	}
	if _, r := device(b); r != nvml.SUCCESS {
		return ret(r)
	}
	// NVML_TOPOLOGY_INTERNAL for a GPU and itself, NVML_TOPOLOGY_SYSTEM otherwise.
	if a == b {
		*level = 0
	} else {
		*level = 50
	}
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetNvLinkState
func nvmlDeviceGetNvLinkState(h C.nvmlDevice_t, link C.uint, state *C.int) C.nvmlReturn_t {
	return ret(nvml.ERROR_NOT_SUPPORTED)
}

// Events: a set has devices registered and no event ever happens (no GPU faults here),
// so a wait lasts its timeout and answers NVML_ERROR_TIMEOUT, as the driver's does.

var (
	setsMu  sync.Mutex
	sets    = map[uintptr]bool{}
	nextSet uintptr
)

//export nvmlEventSetCreate
func nvmlEventSetCreate(out *C.nvmlEventSet_t) C.nvmlReturn_t {
	setsMu.Lock()
	defer setsMu.Unlock()
	nextSet++
	sets[nextSet] = true
	*out = C.nvmlEventSet_t(unsafe.Pointer(nextSet))
	return ret(nvml.SUCCESS)
}

//export nvmlEventSetFree
func nvmlEventSetFree(set C.nvmlEventSet_t) C.nvmlReturn_t {
	setsMu.Lock()
	defer setsMu.Unlock()
	if !sets[uintptr(set)] {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	delete(sets, uintptr(set))
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(h C.nvmlDevice_t, types *C.ulonglong) C.nvmlReturn_t {
	if _, r := device(h); r != nvml.SUCCESS {
		return ret(r)
	}
	*types = C.ulonglong(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError)
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(h C.nvmlDevice_t, types C.ulonglong, set C.nvmlEventSet_t) C.nvmlReturn_t {
	if _, r := device(h); r != nvml.SUCCESS {
		return ret(r)
	}
	setsMu.Lock()
	defer setsMu.Unlock()
	if !sets[uintptr(set)] {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	return ret(nvml.SUCCESS)
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set C.nvmlEventSet_t, data *C.nvmlEventData_t, ms C.uint) C.nvmlReturn_t {
	setsMu.Lock()
	ok := sets[uintptr(set)]
	setsMu.Unlock()
	if !ok {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	time.Sleep(time.Duration(ms) * time.Millisecond)
	return ret(nvml.ERROR_TIMEOUT)
}

//export nvmlEventSetWait
func nvmlEventSetWait(set C.nvmlEventSet_t, data *C.nvmlEventData_t, ms C.uint) C.nvmlReturn_t {
	return nvmlEventSetWait_v2(set, data, ms)
}

func main() {}
