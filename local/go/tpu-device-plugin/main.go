// Command tpu-device-plugin advertises a node's TPU chips to its kubelet as the extended resource
// google.com/tpu, through the kubelet's device-plugin API (k8s.io/kubelet deviceplugin v1beta1),
// so that TPU pods, which request google.com/tpu as on GKE, schedule and start unchanged on the
// local stack's real nodes (local/multislice_local/realnodes.py). There are no chips behind the
// devices: Allocate hands the container nothing but the allocation itself, which the kubelet
// records in its checkpoint.
//
//	tpu-device-plugin --plugin-dir /var/lib/kubelet/device-plugins --chips 4
//
// It serves its gRPC API on <plugin-dir>/<socket>, registers with <plugin-dir>/kubelet.sock, and
// serves and registers again whenever its socket disappears (a restarted kubelet removes every
// socket in the directory and waits for plugins to register again).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	stop    chan struct{} // closed when this server instance stops
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once: their health never changes.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		log.Printf("allocate %v", c.DevicesIds)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// serve starts a gRPC server on socket and returns it once it accepts connections.
func serve(socket string, p *plugin) (*grpc.Server, error) {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() {
		if err := srv.Serve(lis); err != nil {
			log.Printf("serve: %v", err)
		}
	}()
	return srv, nil
}

func register(dir, socket, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(socket),
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

func main() {
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	chips := flag.Int("chips", 4, "TPU chips on this host (devices advertised)")
	resource := flag.String("resource", "google.com/tpu", "extended resource name")
	name := flag.String("socket", "tpu.sock", "this plugin's socket name in --plugin-dir")
	flag.Parse()
	if *chips < 1 {
		log.Fatalf("--chips must be at least 1, got %d", *chips)
	}
	socket := filepath.Join(*dir, *name)
	devices := make([]*pluginapi.Device, *chips)
	for i := range devices {
		devices[i] = &pluginapi.Device{ID: fmt.Sprintf("tpu-%d", i), Health: pluginapi.Healthy}
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	var srv *grpc.Server
	var current *plugin
	stopServer := func() {
		if srv != nil {
			close(current.stop)
			srv.Stop()
			srv = nil
		}
	}
	defer os.Remove(socket)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if _, err := os.Stat(socket); srv == nil || err != nil {
			stopServer()
			current = &plugin{devices: devices, stop: make(chan struct{})}
			s, err := serve(socket, current)
			if err != nil {
				log.Printf("serve %s: %v (retrying)", socket, err)
			} else if err := register(*dir, socket, *resource); err != nil {
				log.Printf("register with the kubelet: %v (retrying)", err)
				s.Stop()
			} else {
				srv = s
				log.Printf("registered %s with %d devices on %s", *resource, *chips, socket)
			}
		}
		select {
		case sig := <-signals:
			log.Printf("%v: stopping", sig)
			stopServer()
			return
		case <-tick.C:
		}
	}
}
