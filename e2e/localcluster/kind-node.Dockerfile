# A kind node image's base, built here by kind-node.sh for machines that cannot pull kind's own
# (kindest/node): what kind's images/base/Dockerfile installs, from Debian's packages (containerd,
# runc and the CNI plugins included) instead of source builds, with kind's own files (its
# entrypoint, systemd units, containerd configuration) from kind's Go module, and the Kubernetes
# binaries the project builds. kind-node.sh then preloads the control plane's images.
ARG BASE
FROM ${BASE}
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod \
      libseccomp2 pigz e2fsprogs bash ca-certificates curl jq procps \
      containerd runc containernetworking-plugins \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
    && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \
    && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
    && ln -sf /usr/lib/systemd/systemd /sbin/init
# kind's files; its containerd unit starts /usr/local/bin/containerd, its configuration finds the
# CNI plugins in /opt/cni/bin.
COPY files/ /
COPY bin/ /usr/bin/
# Where root lacks CAP_SYS_RESOURCE (these VMs), no process may lower an oom_score_adj: containerd
# must not try for its containers (as kind's entrypoint sets it in a user namespace), nor systemd
# for containerd (kind-node/etc/systemd/system/containerd.service.d).
RUN sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml \
    && grep -q 'restrict_oom_score_adj = true' /etc/containerd/config.toml \
    && ln -s /usr/bin/containerd /usr/local/bin/containerd \
    && ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' >/etc/containerd/cri-base.json \
    && mkdir -p /opt/cni/bin && ln -s /usr/lib/cni/* /opt/cni/bin/ \
    && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
    && systemctl mask systemd-binfmt.service \
    && mkdir -p /etc/kubernetes/manifests
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
