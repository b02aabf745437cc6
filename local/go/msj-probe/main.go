// Command msj-probe is the real-node tests' container program (local/multislice_local/realnodes.py
// puts it in a small image): one static binary, standard library only, with a subcommand per
// thing a test asks of a pod.
//
//	msj-probe sleep                       run until SIGTERM, then exit 0
//	msj-probe exit CODE [MESSAGE]         write MESSAGE to /dev/termination-log, exit CODE
//	msj-probe env                         print the environment, one VAR=value a line
//	msj-probe serve ADDR                  answer every TCP connection with the hostname, until SIGTERM
//	msj-probe dial ADDR [SECONDS]         print what ADDR answers (retried up to SECONDS, default 30)
//	msj-probe resolve NAME [SECONDS]      print NAME's addresses from the pod's resolv.conf (retried)
//	msj-probe kube GET-PATH               GET the path from the apiserver as the pod's service account,
//	                                      found through KUBERNETES_SERVICE_HOST/PORT; print the status
//	                                      code and the body
//	msj-probe starts FILE [then ...]      append a line to FILE, print how many it holds, then run
//	                                      the rest as another subcommand (counts container starts)
//	msj-probe once FILE CODE [then ...]   the first time (no FILE yet): create FILE and exit CODE;
//	                                      later: run the rest as another subcommand
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fail(2, "usage: msj-probe sleep|exit|env|serve|dial|resolve|kube|starts|once ...")
	}
	os.Exit(run(os.Args[1], os.Args[2:]))
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "msj-probe: "+format+"\n", args...)
	os.Exit(code)
}

func arg(args []string, i int, what string) string {
	if len(args) <= i {
		fail(2, "missing %s", what)
	}
	return args[i]
}

func seconds(args []string, i int) time.Duration {
	if len(args) <= i {
		return 30 * time.Second
	}
	n, err := strconv.Atoi(args[i])
	if err != nil {
		fail(2, "SECONDS: %v", err)
	}
	return time.Duration(n) * time.Second
}

func run(cmd string, args []string) int {
	switch cmd {
	case "sleep":
		waitForSignal()
		return 0
	case "exit":
		code, err := strconv.Atoi(arg(args, 0, "CODE"))
		if err != nil {
			fail(2, "CODE: %v", err)
		}
		if len(args) > 1 {
			_ = os.WriteFile("/dev/termination-log", []byte(strings.Join(args[1:], " ")), 0o644)
		}
		return code
	case "env":
		env := os.Environ()
		sort.Strings(env)
		for _, kv := range env {
			fmt.Println(kv)
		}
		return 0
	case "serve":
		return serve(arg(args, 0, "ADDR"))
	case "dial":
		return retry(seconds(args, 1), func() error { return dial(arg(args, 0, "ADDR")) })
	case "resolve":
		return retry(seconds(args, 1), func() error { return resolve(arg(args, 0, "NAME")) })
	case "kube":
		return kube(arg(args, 0, "GET-PATH"))
	case "starts":
		return starts(arg(args, 0, "FILE"), args[1:])
	case "once":
		return once(arg(args, 0, "FILE"), arg(args, 1, "CODE"), args[2:])
	}
	fail(2, "unknown subcommand %q", cmd)
	return 2
}

func waitForSignal() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}

func retry(limit time.Duration, try func() error) int {
	deadline := time.Now().Add(limit)
	for {
		err := try()
		if err == nil {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "msj-probe: %v\n", err)
			return 1
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func serve(addr string) int {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "msj-probe: listen %s: %v\n", addr, err)
		return 1
	}
	host, _ := os.Hostname()
	fmt.Printf("serving on %s\n", lis.Addr())
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(conn, "%s\n", host)
			conn.Close()
		}
	}()
	waitForSignal()
	return 0
}

func dial(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	fmt.Print(line)
	return nil
}

func resolve(name string) error {
	// The pure-Go resolver reads /etc/resolv.conf as libc would (search list, ndots).
	r := &net.Resolver{PreferGo: true}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(ctx, name)
	if err != nil {
		return err
	}
	sort.Strings(addrs)
	fmt.Println(strings.Join(addrs, " "))
	return nil
}

func kube(path string) int {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		fail(1, "KUBERNETES_SERVICE_HOST/PORT not set")
	}
	token, err := os.ReadFile(serviceAccount + "/token")
	if err != nil {
		fail(1, "service account token: %v", err)
	}
	caPEM, err := os.ReadFile(serviceAccount + "/ca.crt")
	if err != nil {
		fail(1, "service account CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		fail(1, "no certificate in %s/ca.crt", serviceAccount)
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	req, err := http.NewRequest(http.MethodGet, "https://"+net.JoinHostPort(host, port)+path, nil)
	if err != nil {
		fail(2, "%v", err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		fail(1, "GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d\n%s\n", resp.StatusCode, body)
	return 0
}

func starts(file string, then []string) int {
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fail(1, "%v", err)
	}
	fmt.Fprintln(f, time.Now().UTC().Format(time.RFC3339Nano))
	f.Close()
	data, err := os.ReadFile(file)
	if err != nil {
		fail(1, "%v", err)
	}
	fmt.Printf("start %d\n", strings.Count(string(data), "\n"))
	if len(then) == 0 {
		return 0
	}
	return run(then[0], then[1:])
}

func once(file, code string, then []string) int {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err == nil {
		f.Close()
		n, err := strconv.Atoi(code)
		if err != nil {
			fail(2, "CODE: %v", err)
		}
		fmt.Printf("first run: exit %d\n", n)
		return n
	}
	if !os.IsExist(err) {
		fail(1, "%v", err)
	}
	if len(then) == 0 {
		return 0
	}
	return run(then[0], then[1:])
}
